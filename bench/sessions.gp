# Chart for bench/sessions: gnuplot -e "dir='DIR'" bench/sessions.gp
# Data (DIR/sessions.dat), one row per way of serving the conversations:
#   label, memory at the end (MiB), first turn and resumed turns' time to
#   first token (median, ms).
# Each way keeps its colour in both panels, and is named in each legend.
set terminal pngcairo size 1200,520 font ",11"
set output dir."/sessions.png"
set multiplot layout 1,2 title \
	"Chat sessions sharing one system prompt (bench/sessions)"
set style fill solid 0.85 border -1
set boxwidth 0.7
set grid ytics
set xrange [-0.6:2.6]
set xtics ("recompute" 0, "slots" 1, "sparsebuf" 2)
set key top right

set title "memory at the end"
set ylabel "MiB"
set yrange [0:*]
plot dir."/sessions.dat" every ::0::0 using (0):2 with boxes \
	title "a: each computes the prompt" lc rgb "#d62728", \
     "" every ::1::1 using (1):2 with boxes \
	title "b: slot files (llama.cpp)" lc rgb "#1f77b4", \
     "" every ::2::2 using (2):2 with boxes \
	title "c: sparsebuf prefix cache + park" lc rgb "#2ca02c"

set title "time to first token (median; log scale)"
set ylabel "ms"
set logscale y
set yrange [*:*]
set xtics ("first turn" 0.5, "resumed turns" 2.5)
set xrange [-0.6:3.6]
set boxwidth 0.3
plot dir."/sessions.dat" every ::0::0 using (0.15):3 with boxes \
	title "a: first" lc rgb "#d62728", \
     "" every ::1::1 using (0.5):3 with boxes title "b: first" \
	lc rgb "#1f77b4", \
     "" every ::2::2 using (0.85):3 with boxes title "c: first (hit)" \
	lc rgb "#2ca02c", \
     "" every ::0::0 using (2.15):4 with boxes title "a: resumed" \
	lc rgb "#d62728" fs pattern 4, \
     "" every ::1::1 using (2.5):4 with boxes title "b: resumed" \
	lc rgb "#1f77b4" fs pattern 4, \
     "" every ::2::2 using (2.85):4 with boxes title "c: resumed" \
	lc rgb "#2ca02c" fs pattern 4
unset multiplot
