// Chapter 03's benchmark program, 03_allreduce_bench: chapter 02's allreduce against the ring,
// nccl-tests style. Everything but the choice of collectives is the harness, shared with
// chapter 04's 04_allreduce_bench, which adds NCCL:
//   benchmark.h, benchmark.cpp          measuring: warm up, check every element, time; the CSV and plot
//   benchmark_program.cpp               the program: command line, memory check, cost model, files
//   build/bin/03_allreduce_bench [-g 2,4,8] [-b 4] [-e 256M] [-f 2] ...   (nccl-tests' flags)
#include "benchmark.h"  // main_program, naive_and_ring: the nccl-tests-style harness

int main(int argc, char** argv) { return bench::main_program(argc, argv, "03_allreduce_bench", bench::naive_and_ring); }
