# cd to this folder, then: gnuplot 08_parameter_server_bsp_k4_straggler0x3_staleness.gp
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced  # '_' is not a subscript
set output '08_parameter_server_bsp_k4_straggler0x3_staleness.png'
set datafile separator ','
set title '08_parameter_server_bsp_k4_straggler0x3: staleness of the pushes (all epochs)'
set xlabel 'staleness (updates between pull and push)'
set ylabel 'pushes'
set style fill solid 0.6
set boxwidth 0.8
set key off
plot '08_parameter_server_bsp_k4_straggler0x3_staleness.csv' using 2:($1 == 0 ? $3 : 1/0) with boxes
