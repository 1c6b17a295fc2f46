# Chapter 08: the parameter server (included at the end of tests/CMakeLists.txt).
mgpu_test(test_parameter_server DEVICE LIBS mgpu_parameter_server)
mgpu_chaos_tests(test_parameter_server)  # the event waits of pulls and pushes, under random delays

# The assignment, ex08.ssp_server (the clocks, the wait for the slowest worker within the bound,
# the pull and the push), and its warm-up, ex08.staleness. Their graded cases: tests/CMakeLists.txt.
mgpu_exercise(ex08.ssp_server test_parameter_server "clocks:*" "pull:*" "push:*" "bsp: training through the server*"
              "asp:*" "ssp:*" "bsp with a straggler*")
mgpu_exercise(ex08.staleness  test_parameter_server "staleness_histogram:*")

set(ps_short --epochs 1 --limit-train 512 --out ${test_results})
expect_exit(08_parameter_server help            0 stdout "Usage: 08_parameter_server.*--straggler" --help)
expect_exit(08_parameter_server mode_bad        2 stderr "--mode: sync not in \\{bsp,asp,ssp\\}" --mode sync)
expect_exit(08_parameter_server staleness_neg   2 stderr "--staleness: must be zero or more, got -1" --mode ssp --staleness -1)
expect_exit(08_parameter_server staleness_alone 2 stderr "--staleness is the bound of --mode ssp.*--mode bsp"
            ${ps_short} --staleness 3)
expect_exit(08_parameter_server servers_zero    2 stderr "--servers: must be at least 1, got 0" --servers 0)
expect_exit(08_parameter_server servers_many    2 stderr "--servers: must be at most 64, got 65" --servers 65)
expect_exit(08_parameter_server straggler_form  2 stderr "--straggler: needs WORKER:FACTOR, e.g. 0:3, got '1'" --straggler 1)
# A '+' (or a space) once passed, trained the whole run and failed at the end on the file name
# made from it: numbers are read strictly now, before anything runs.
expect_exit(08_parameter_server straggler_plus  2 stderr "--straggler: needs WORKER:FACTOR, e.g. 0:3, got '0:.3'" --straggler 0:+3)
expect_exit(08_parameter_server straggler_fast  2 stderr "--straggler: the factor must be from 1 to 100, got '0.5'"
            --straggler 0:0.5)
expect_exit(08_parameter_server straggler_who   2 stderr "--straggler 2: there are only 2 workers"
            ${ps_short} --straggler 2:3)
expect_exit(08_parameter_server devices_zero    2 stderr "--devices: must be at least 1, got 0" --devices 0)
expect_exit(08_parameter_server last_batch_small 1 stderr "leave a last batch of 1 example.s. in every epoch"
            --limit-train 1001 --batch-size 250 --devices 4)
# A short run of each mode: the summary line, and SSP's bound kept (1 worker ahead: (k-1)(2s+1) = 3).
expect_exit(08_parameter_server asp_run 0 stdout "parameter_server: mode=asp .*pushes=4 " ${ps_short} --mode asp)
expect_exit(08_parameter_server ssp_run 0 stdout "mode=ssp staleness_bound=1 .*staleness_max=[0-3] "
            ${ps_short} --mode ssp --staleness 1 --straggler 0:3)
expect_exit(08_parameter_server bsp_shards 0 stdout "measured 1033728, formula 2k/s x model = 1033728"
            ${ps_short} --servers 2)
