# Chart for bench/flash.sh: gnuplot -e "dir='build/bench-flash'" bench/flash.gp
set terminal pngcairo size 1100,500 font ",11" noenhanced
set output dir."/flash.png"
set multiplot layout 1,2 title "LLM in a flash: a model twice its memory budget"
set style data histograms
set style fill solid 0.8 border -1
set boxwidth 0.7
set grid ytics
unset key
set xtics rotate by -20
set title "tokens/s (higher is better)"
set logscale y
plot dir."/flash.dat" using 3:xtic(2) lc rgb "#3070b0"
set title "MiB read from disk per token (lower is better)"
set yrange [0.1:*]
plot dir."/flash.dat" using ($4 > 0.1 ? $4 : 0.1):xtic(2) lc rgb "#b05030"
unset multiplot
