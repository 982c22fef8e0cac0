# Charts for bench/kv: gnuplot -e "dir='build/bench-kv'" bench/kv.gp
# Data columns: tokens, then strategies 1..6, then 0 (the noise floor), 7 and 8.
# Each strategy keeps its colour (linetype = its number) in both charts.
set terminal pngcairo size 1100,650 font ",11"
set key top left
set grid
set xlabel "tokens"
set style data lines

set output dir."/memory.png"
set title "KV cache committed memory vs tokens (Qwen3-4B geometry, bf16)"
set ylabel "committed (MiB)"
plot dir."/memory.dat" using 1:2 title "dense (llama.cpp)" lt 1 lw 2, \
     "" using 1:3 title "chunks of 256 (mlx-lm)" lt 2 lw 2, \
     "" using 1:4 title "doubling, +1 GiB (llama.cpp patch)" lt 3 lw 2, \
     "" using 1:5 title "kernel demand paging" lt 4 lw 2 dt 2, \
     "" using 1:6 title "sparsebuf, prepare ahead" lt 5 lw 3, \
     "" using 1:7 title "sparsebuf, on fault only" lt 6 lw 2 dt 3, \
     "" using 1:9 title "sparsebuf core API, sb_buf_map ahead" noenhanced \
	lt 7 lw 2 dt 4, \
     "" using 1:10 title "core API, no SB_BUF_GROWS" noenhanced lt 8 lw 1 dt 5

# The floor first, in grey, so that everything else is drawn over it: what
# stands above the grey band is the strategy's, not the machine's.
set output dir."/stall.png"
set title "Growth stall per decode step (time beyond the plain K/V writes)"
set ylabel "stall (us, log scale)"
set logscale y
set yrange [0.1:*]
set style data points
plot dir."/stall.dat" using 1:8 title "noise floor (nothing to grow)" \
	pt 7 ps 0.2 lc rgb "#b0b0b0", \
     "" using 1:3 title "chunks of 256 (mlx-lm)" lt 2 pt 7 ps 0.4, \
     "" using 1:4 title "doubling, +1 GiB (llama.cpp patch)" lt 3 pt 7 \
	ps 0.6, \
     "" using 1:5 title "kernel demand paging" lt 4 pt 7 ps 0.2, \
     "" using 1:7 title "sparsebuf, on fault only" lt 6 pt 7 ps 0.2, \
     "" using 1:6 title "sparsebuf, prepare ahead" lt 5 pt 7 ps 0.3, \
     "" using 1:10 title "core API, no SB_BUF_GROWS" noenhanced lt 8 pt 1 \
	ps 0.3, \
     "" using 1:9 title "sparsebuf core API, sb_buf_map ahead" noenhanced \
	lt 7 pt 6 ps 0.3
