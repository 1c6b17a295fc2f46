# The steps of tools/gpu_check.sh that run a program, in the order they run. This file is their
# only list: tests/gpu_check.cmake includes it, and each step becomes a CTest test, gpu.<step>,
# labelled "gpu", run alone (RUN_SERIAL: seconds per epoch only compare when nothing else runs)
# and judged by run_step.cmake. Run as a script it prints each step's name and what it runs,
# one a line, as on a machine with 2 GPUs, mpirun and PyTorch with CUDA (gpu_check.sh --list-steps):
#   cmake -P tools/gpu_check/steps.cmake
#
# The commands are d2l's defaults (10 epochs, batch 256, lr 0.2, all 60,000 images; ResNet-18's
# lr 0.1 is its program's default). run_step.cmake appends what --quick or a machine without a
# GPU changes, by the step's kind:
#   lenet    a LeNet training          resnet   ResNet-18, its full recipe (10 epochs)
#   resnet3  ResNet-18 for 3 epochs    mpi      chapter 05 under mpirun
#   twin     a PyTorch twin of 01      twin3    a PyTorch twin of 09, 3 epochs
#   bench    an allreduce benchmark   kernels  chapter 10's kernel benchmark
# A plain `ctest` skips these tests (about ten minutes on one H100): they run only when the
# check sets MGPU_GPU_CHECK. The "all GPUs" steps are registered only where 2 or more GPUs are
# counted (MGPU_GPU_CHECK_GPUS, which gpu_check.sh sets when it configures).

if(CMAKE_SCRIPT_MODE_FILE)  # cmake -P: list the plan
  set(gpus 2)
  set(bin bin)
  set(mpirun env OMPI_MCA_btl_vader_single_copy_mechanism=none mpirun --oversubscribe)
  set(collective nccl)
  set(chapters chapters)
  function(gpu_step name kind title)
    message("${name}\t${title}")
  endfunction()
else()
  if(NOT DEFINED MGPU_GPU_CHECK_GPUS)
    set(MGPU_GPU_CHECK_GPUS ${MGPU_GPU_COUNT} CACHE STRING
        "GPUs the GPU check's all-GPU steps use (tools/gpu_check.sh sets it from nvidia-smi)")
  endif()
  set(gpus ${MGPU_GPU_CHECK_GPUS})
  set(bin ${CMAKE_BINARY_DIR}/bin)
  set(chapters ${CMAKE_SOURCE_DIR}/chapters)
  # As the tests run mpiexec (tests/CMakeLists.txt: mpi_env, mpi_preflags); missing, the
  # chapter 05 steps say so.
  set(mpirun env ${mpi_env} ${MPIEXEC_EXECUTABLE})
  separate_arguments(preflags UNIX_COMMAND "${mpi_preflags}")
  list(APPEND mpirun ${preflags})
  set(mpi_missing "")
  if(NOT MPIEXEC_EXECUTABLE)
    set(mpirun mpirun)
    set(mpi_missing "mpirun not found (Debian/Ubuntu: apt-get install openmpi-bin)")
  endif()
  # A rank per GPU sums with NCCL; a cpu build has only MPI's collectives.
  set(collective mpi)
  if(MGPU_BACKEND_RESOLVED STREQUAL "cuda")
    set(collective nccl)
  endif()
  # gpu_step(<name> <kind> <title> [ONE_GPU] [MISSING <why>] COMMAND <word>...)
  # ONE_GPU: on the first GPU only (CUDA_VISIBLE_DEVICES), however many the machine has.
  function(gpu_step name kind title)
    cmake_parse_arguments(S "ONE_GPU" "MISSING" "COMMAND" ${ARGN})
    add_test(NAME gpu.${name}
             COMMAND ${CMAKE_COMMAND} -DSTEP=${name} -DKIND=${kind} "-DTITLE=${title}" -DONE_GPU=${S_ONE_GPU}
                     "-DMISSING=${S_MISSING}" -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/run_step.cmake -- ${S_COMMAND}
             WORKING_DIRECTORY ${CMAKE_SOURCE_DIR})
    # run_step.cmake stops a step at 300 s; ctest's limit is only there should it hang itself.
    set_tests_properties(gpu.${name} PROPERTIES LABELS gpu RUN_SERIAL TRUE TIMEOUT 360
                         SKIP_REGULAR_EXPRESSION "gpu_check step not run:")
    if(kind MATCHES "^twin")
      set_tests_properties(gpu.${name} PROPERTIES LABELS "gpu;twin")
    endif()
  endfunction()
endif()

# 1, 2, 4, 8 devices up to the GPU count, and the count itself: the benchmarks' --devices.
set(counts "")
foreach(k 1 2 4 8)
  if(k LESS_EQUAL gpus)
    list(APPEND counts ${k})
  endif()
endforeach()
if(gpus GREATER 0)
  list(APPEND counts ${gpus})
endif()
list(REMOVE_DUPLICATES counts)

gpu_step(01_lenet_1dev lenet "chapter 01 on 1 GPU, with one step's kernel table"
         COMMAND ${bin}/01_lenet --devices 1 --profile on)
# The same without the recorded step (CUDA graph): what one launch per step saves.
gpu_step(01_lenet_1dev_no_graph lenet "chapter 01 on 1 GPU, every kernel launched every step (--graph off)"
         COMMAND ${bin}/01_lenet --devices 1 --graph off)

foreach(chapter 02_data_parallel 03_ring_allreduce 08_parameter_server)
  string(SUBSTRING ${chapter} 0 2 number)
  gpu_step(${chapter}_1dev lenet "chapter ${number} on 1 GPU" COMMAND ${bin}/${chapter} --devices 1)
  if(gpus GREATER_EQUAL 2)
    gpu_step(${chapter}_all_gpus lenet "chapter ${number} on all GPUs" COMMAND ${bin}/${chapter} --devices ${gpus})
  endif()
  foreach(k 2 4)  # the classroom case: logical devices sharing one GPU
    gpu_step(${chapter}_${k}dev_1gpu lenet "chapter ${number}, ${k} logical devices on one GPU" ONE_GPU
             COMMAND ${bin}/${chapter} --devices ${k})
  endforeach()
endforeach()

# Chapter 06: TF32 on 1 GPU; bf16 (16-bit gradients through the ring) and fp16 (dynamic loss
# scaling) on 2 logical devices; bf16 with the 16-bit NCCL exchange on all GPUs.
gpu_step(06_mixed_precision_1dev_tf32 lenet "chapter 06 on 1 GPU, TF32"
         COMMAND ${bin}/06_mixed_precision --devices 1 --precision tf32)
foreach(precision bf16 fp16)
  gpu_step(06_mixed_precision_2dev_1gpu_${precision} lenet "chapter 06, ${precision} on 2 logical devices on one GPU"
           ONE_GPU COMMAND ${bin}/06_mixed_precision --devices 2 --precision ${precision})
endforeach()
if(gpus GREATER_EQUAL 2)
  gpu_step(06_mixed_precision_all_gpus_bf16_nccl lenet "chapter 06, bf16 on all GPUs, 16-bit NCCL exchange"
           COMMAND ${bin}/06_mixed_precision --devices ${gpus} --precision bf16 --allreduce nccl)
endif()

# Chapter 07: GPipe and 1F1B over 2 logical devices, the 2x2 hybrid on 4, GPipe over 2 GPUs.
foreach(schedule gpipe 1f1b)
  gpu_step(07_model_parallel_2dev_1gpu_${schedule} lenet "chapter 07, ${schedule} over 2 logical devices on one GPU"
           ONE_GPU COMMAND ${bin}/07_model_parallel --devices 2 --schedule ${schedule})
endforeach()
gpu_step(07_model_parallel_4dev_1gpu_hybrid lenet "chapter 07, 2 pipelines x 2 stages on 4 logical devices on one GPU"
         ONE_GPU COMMAND ${bin}/07_model_parallel --devices 4 --data-parallel 2)
if(gpus GREATER_EQUAL 2)
  gpu_step(07_model_parallel_2gpus_gpipe lenet "chapter 07, GPipe over 2 GPUs"
           COMMAND ${bin}/07_model_parallel --devices 2 --schedule gpipe)
endif()

# Chapter 11: ZeRO stage 1 beside DDP (AdamW), 2 logical devices on one GPU; stage 1 on all GPUs.
foreach(stage 0 1)
  gpu_step(11_sharded_data_parallel_2dev_1gpu_zero${stage} lenet "chapter 11, --zero ${stage} on 2 logical devices on one GPU"
           ONE_GPU COMMAND ${bin}/11_sharded_data_parallel --devices 2 --zero ${stage})
endforeach()
if(gpus GREATER_EQUAL 2)
  gpu_step(11_sharded_data_parallel_all_gpus lenet "chapter 11, ZeRO stage 1 on all GPUs"
           COMMAND ${bin}/11_sharded_data_parallel --devices ${gpus} --zero 1)
endif()

# Chapter 09: d2l 13.6's recipe once, with its kernel table; the other runs 3 epochs each, to
# keep the check within minutes. d2l's 2-GPU recipe scales batch and rate with the GPUs.
gpu_step(09_resnet_1dev resnet "chapter 09 (ResNet-18) on 1 GPU, with one step's kernel table"
         COMMAND ${bin}/09_resnet --devices 1 --profile on)
foreach(precision tf32 bf16)
  gpu_step(09_resnet_1dev_${precision} resnet3 "chapter 09 on 1 GPU, GEMM inputs read as ${precision} by tensor cores"
           COMMAND ${bin}/09_resnet --devices 1 --precision ${precision} --epochs 3)
endforeach()
gpu_step(09_resnet_2dev_1gpu_sync resnet3 "chapter 09, SyncBN on 2 logical devices on one GPU"
         ONE_GPU COMMAND ${bin}/09_resnet --devices 2 --bn sync --epochs 3)
if(gpus GREATER_EQUAL 2)
  math(EXPR batch "256 * ${gpus}")
  set(lr ${gpus}e-1)  # 0.1 a GPU
  gpu_step(09_resnet_all_gpus resnet3 "chapter 09 on all GPUs, BatchNorm per device"
           COMMAND ${bin}/09_resnet --devices ${gpus} --batch-size ${batch} --lr ${lr} --epochs 3)
  gpu_step(09_resnet_all_gpus_sync resnet3 "chapter 09 on all GPUs, SyncBN"
           COMMAND ${bin}/09_resnet --devices ${gpus} --bn sync --batch-size ${batch} --lr ${lr} --epochs 3)
endif()

# Chapter 02's DataParallel-style trainer (everything through device 0), beside the DDP-style runs.
gpu_step(02_dataparallel_2dev_1gpu lenet "chapter 02, DataParallel-style trainer, 2 logical devices on one GPU"
         ONE_GPU COMMAND ${bin}/02_data_parallel --trainer dataparallel --devices 2)
if(gpus GREATER_EQUAL 2)
  gpu_step(02_dataparallel_all_gpus lenet "chapter 02, DataParallel-style trainer, all GPUs"
           COMMAND ${bin}/02_data_parallel --trainer dataparallel --devices ${gpus})
endif()

# Chapter 04: NCCL, one rank per GPU.
gpu_step(04_nccl_1gpu lenet "chapter 04 (NCCL) on 1 GPU" COMMAND ${bin}/04_nccl --devices 1)
if(gpus GREATER_EQUAL 2)
  gpu_step(04_nccl_all_gpus lenet "chapter 04 (NCCL) on all GPUs" COMMAND ${bin}/04_nccl --devices ${gpus})
endif()

# Chapter 05: one process per device. Two ranks on one GPU get no --collective: they must fall
# back from NCCL (which refuses two ranks on one GPU) to MPI by themselves.
gpu_step(05_multi_process_np1 mpi "chapter 05, mpirun -np 1, collective ${collective}" MISSING "${mpi_missing}"
         COMMAND ${mpirun} -np 1 ${bin}/05_multi_process --collective ${collective})
if(gpus GREATER_EQUAL 2)
  gpu_step(05_multi_process_all_gpus mpi "chapter 05, one rank per GPU, NCCL" MISSING "${mpi_missing}"
           COMMAND ${mpirun} -np ${gpus} ${bin}/05_multi_process --collective nccl)
endif()
gpu_step(05_multi_process_np2_1gpu mpi "chapter 05, mpirun -np 2 on one GPU (ranks share it: the default falls back to MPI)"
         ONE_GPU MISSING "${mpi_missing}" COMMAND ${mpirun} -np 2 ${bin}/05_multi_process)

# The PyTorch twins of chapters 01 and 09, on the first GPU, in each precision the C++ runs use
# (fp32 with TF32 off, TF32, bf16 autocast). --device cuda: a twin that cannot use the GPU stops.
gpu_step(01_lenet_torch twin "chapter 01's PyTorch twin, fp32 (TF32 off)" ONE_GPU
         COMMAND python3 ${chapters}/01_lenet/lenet_torch.py --device cuda --precision fp32)
foreach(precision fp32 tf32 bf16)
  gpu_step(09_resnet_torch_${precision} twin3 "chapter 09's PyTorch twin, ${precision}" ONE_GPU
           COMMAND python3 ${chapters}/09_resnet/resnet_torch.py --device cuda --precision ${precision} --epochs 3)
endforeach()

# The benchmarks check every element of every allreduce and exit non-zero when one is wrong.
# Chapter 03's places logical devices round-robin on the GPUs: 2 and 4 always.
set(bench_sizes -e 64M -w 5 -n 20)
set(ring_counts ${counts} 2 4)
if(gpus EQUAL 0)  # no GPU (--allow-no-gpu): replicas in host memory, 2 are enough
  set(ring_counts 1 2)
endif()
list(REMOVE_DUPLICATES ring_counts)
list(SORT ring_counts COMPARE NATURAL)
list(JOIN ring_counts "," ring_counts)
gpu_step(03_allreduce_bench bench "naive and ring on ${ring_counts} devices"
         COMMAND ${bin}/03_allreduce_bench -g ${ring_counts} ${bench_sizes})
if(NOT counts)
  set(counts 1)
endif()
list(JOIN counts "," counts)
gpu_step(04_allreduce_bench bench "naive, ring and NCCL on ${counts} GPU(s)"
         COMMAND ${bin}/04_allreduce_bench -g ${counts} ${bench_sizes})
# Chapter 10: its raw kernels against chapter 09's at ResNet-18's shapes, every element checked
# (a wrong one exits 1), each kernel's GB/s against the GPU's copy rate measured in the same run.
gpu_step(10_fast_kernels kernels "chapter 10's raw kernels against chapter 09's at ResNet-18's shapes" ONE_GPU
         COMMAND ${bin}/10_fast_kernels)
