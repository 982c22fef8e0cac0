# Charts for bench/kv: gnuplot -e "dir='build/bench-kv'" bench/kv.gp
set terminal pngcairo size 1100,650 font ",11"
set key top left
set grid
set xlabel "tokens"
set style data lines

set output dir."/memory.png"
set title "KV cache committed memory vs tokens (Qwen3-4B geometry, bf16)"
set ylabel "committed (MiB)"
plot dir."/memory.dat" using 1:2 title "dense (llama.cpp)" lw 2, \
     "" using 1:3 title "chunks of 256 (mlx-lm)" lw 2, \
     "" using 1:4 title "doubling, +1 GiB (llama.cpp patch)" lw 2, \
     "" using 1:5 title "kernel demand paging" lw 2 dt 2, \
     "" using 1:6 title "sparsebuf, prepare ahead" lw 3, \
     "" using 1:7 title "sparsebuf, on fault only" lw 2 dt 3

set output dir."/stall.png"
set title "Growth stall per decode step (time beyond the plain K/V writes)"
set ylabel "stall (us, log scale)"
set logscale y
set yrange [0.1:*]
set style data points
plot dir."/stall.dat" using 1:3 title "chunks of 256 (mlx-lm)" pt 7 ps 0.4, \
     "" using 1:4 title "doubling, +1 GiB (llama.cpp patch)" pt 7 ps 0.6, \
     "" using 1:5 title "kernel demand paging" pt 7 ps 0.2, \
     "" using 1:7 title "sparsebuf, on fault only" pt 7 ps 0.2, \
     "" using 1:6 title "sparsebuf, prepare ahead" pt 7 ps 0.3
