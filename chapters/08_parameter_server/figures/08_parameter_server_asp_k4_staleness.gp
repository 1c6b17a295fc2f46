# cd to this folder, then: gnuplot 08_parameter_server_asp_k4_staleness.gp
# drawn again at commit 617ef44 by make_figures.sh redraw, from the CSV (the run's commit: 08_parameter_server_asp_k4.json)
set terminal pngcairo size 1000,400 font 'sans,10' noenhanced
set output '08_parameter_server_asp_k4_staleness.png'
set datafile separator ','
set title '08_parameter_server_asp_k4: staleness of the pushes (all epochs)'
set xlabel 'staleness (updates between pull and push)'
set ylabel 'pushes'
set xrange [-0.5:13-0.5]
set xtics 1
set yrange [0:*]
set style fill solid 0.6
set boxwidth 0.8
set key off
plot '08_parameter_server_asp_k4_staleness.csv' using 2:($1 == 0 ? $3 : 1/0) with boxes
