# drawn again at commit 617ef44 by tools/redraw_run_plots.sh, from the CSV (the run's commit: 08_parameter_server_bsp_k4.json)
# cd to this folder, then: gnuplot 08_parameter_server_bsp_k4.gp
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced  # '_' is not a subscript
set output '08_parameter_server_bsp_k4.png'
set datafile separator ','
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced
set grid
set xrange [0.5:4.5]
set xtics 1
set bmargin 7
set offsets 0, 0, graph 0.05, 0
set multiplot layout 1,2 title '08_parameter_server_bsp_k4: cpu backend, 4 device(s), batch 64, lr 0.2'
set key below left vertical maxrows 3
set xlabel 'epoch'
set ylabel 'loss, accuracy'
set yrange [0:*]
plot '08_parameter_server_bsp_k4.csv' using 1:2 with linespoints lc rgb '#0072b2' dt 1 pt 7 notitle, '08_parameter_server_bsp_k4.csv' using 1:3 with linespoints lc rgb '#cc79a7' dt 1 pt 7 notitle, '08_parameter_server_bsp_k4.csv' using 1:4 with linespoints lc rgb '#009e73' dt 1 pt 7 notitle, 1/0 with lines lw 2 lc rgb '#0072b2' title 'train loss', 1/0 with lines lw 2 lc rgb '#cc79a7' title 'train acc', 1/0 with lines lw 2 lc rgb '#009e73' title 'test acc'
set key below left vertical maxrows 3
set xlabel 'epoch'
set ylabel 'seconds per epoch'
set yrange [0:*]
plot '08_parameter_server_bsp_k4.csv' using 1:($6 == 1 ? $5 : 1/0) with linespoints lc rgb '#000000' dt 1 pt 7 title 'seconds per epoch', '08_parameter_server_bsp_k4.csv' using 1:($6 == 1 ? 1/0 : $5) with points pt 6 ps 1.5 lc rgb '#000000' notitle, 1/0 with points pt 6 ps 1.5 lc rgb '#000000' title 'first epoch: one-time set-up included'
unset multiplot
