# cd to this folder, then: gnuplot 08_parameter_server_bsp_k4.gp
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced  # '_' is not a subscript
set output '08_parameter_server_bsp_k4.png'
set datafile separator ','
set key autotitle columnhead bottom right
set grid
set xrange [0:*]
set multiplot layout 1,2 title '08_parameter_server_bsp_k4: cpu backend, 4 device(s), batch 64, lr 0.5'
set xlabel 'epoch'
set ylabel 'test accuracy'
set yrange [0:1]
plot '08_parameter_server_bsp_k4.csv' using 1:4 with linespoints lc 1 title '08_parameter_server_bsp_k4'
set xlabel 'epoch'
set ylabel "seconds per epoch\n(open circle: one-time set-up included)"
set yrange [0:*]
plot '08_parameter_server_bsp_k4.csv' using 1:($6 == 1 ? $5 : 1/0) with linespoints lc 1 title '08_parameter_server_bsp_k4', '08_parameter_server_bsp_k4.csv' using 1:($6 == 1 ? 1/0 : $5) with points pt 6 ps 1.5 lc 1 notitle
unset multiplot
