# Resolves MGPU_BACKEND (auto|cpu|cuda) and defines:
#   MGPU_BACKEND_RESOLVED   cpu or cuda
#   MGPU_GPU_COUNT          GPUs that answered nvidia-smi at configure time
#   mgpu_backend            interface target: the defines, include paths and libraries of the backend
#   mgpu_device_sources()   marks .cu files (code shared by both backends) for the right compiler
#   MGPU_HAVE_NCCL, MGPU_BLAS_NAME

# --- Does a GPU answer? (the only reliable configure-time test that needs no compilation)
set(MGPU_GPU_COUNT 0)
find_program(MGPU_NVIDIA_SMI nvidia-smi)
if(MGPU_NVIDIA_SMI)
  execute_process(COMMAND ${MGPU_NVIDIA_SMI} -L OUTPUT_VARIABLE _smi RESULT_VARIABLE _smi_rc ERROR_QUIET)
  if(_smi_rc EQUAL 0)
    string(REGEX MATCHALL "GPU [0-9]+:" _gpus "${_smi}")
    list(LENGTH _gpus MGPU_GPU_COUNT)
  endif()
endif()

include(CheckLanguage)
if(NOT MGPU_BACKEND MATCHES "^(auto|cpu|cuda)$")
  message(FATAL_ERROR "MGPU_BACKEND must be auto, cpu or cuda (got '${MGPU_BACKEND}')")
endif()
set(MGPU_BACKEND_RESOLVED ${MGPU_BACKEND})
if(MGPU_BACKEND STREQUAL "auto" OR MGPU_BACKEND STREQUAL "cuda")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(MGPU_BACKEND STREQUAL "auto")
    if(CMAKE_CUDA_COMPILER AND MGPU_GPU_COUNT GREATER 0)
      set(MGPU_BACKEND_RESOLVED cuda)
    else()
      set(MGPU_BACKEND_RESOLVED cpu)
    endif()
  elseif(NOT CMAKE_CUDA_COMPILER)
    message(FATAL_ERROR "MGPU_BACKEND=cuda but no CUDA compiler (nvcc) was found; "
                        "install the CUDA toolkit or configure with -DMGPU_BACKEND=cpu")
  endif()
endif()

# What the build resolved, for whoever reads the cache later (tools/gpu_check.sh's report): the
# cached MGPU_BACKEND is what was asked for ("auto" too), and CMAKE_CUDA_ARCHITECTURES is cached
# only where it was given on the command line.
set(MGPU_BUILT_BACKEND ${MGPU_BACKEND_RESOLVED} CACHE INTERNAL "the backend this build compiles (cpu or cuda)")
set(MGPU_BUILT_CUDA_ARCHITECTURES "" CACHE INTERNAL "the CUDA architectures this build compiles for")

add_library(mgpu_backend INTERFACE)
set(MGPU_HAVE_NCCL OFF)

if(MGPU_BACKEND_RESOLVED STREQUAL "cuda")
  # An explicit list, never "native": "native" fails on a machine without a GPU (CI compiles
  # the cuda backend there). sm_75 Turing (T4), sm_80 Ampere (also runs on 8.6/8.9), sm_90 Hopper;
  # the compute_90 PTX in the last entry lets newer GPUs JIT-compile it.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 75-real 80-real 90)
  endif()
  enable_language(CUDA)
  set(_archs "${CMAKE_CUDA_ARCHITECTURES}")
  if(_archs STREQUAL "native" AND CMAKE_CUDA_ARCHITECTURES_NATIVE)
    set(_archs "native: ${CMAKE_CUDA_ARCHITECTURES_NATIVE}")  # what "native" found here
  endif()
  set(MGPU_BUILT_CUDA_ARCHITECTURES "${_archs}" CACHE INTERNAL "the CUDA architectures this build compiles for")
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  find_package(CUDAToolkit REQUIRED)
  target_compile_definitions(mgpu_backend INTERFACE MGPU_CUDA=1
                             THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_CUDA)
  target_link_libraries(mgpu_backend INTERFACE CUDA::cudart CUDA::cublas)
  target_compile_options(mgpu_backend INTERFACE
    $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -Xcompiler=-Wall>)
  set(MGPU_BLAS_NAME "cuBLAS ${CUDAToolkit_VERSION}")

  # NCCL: where NCCL_ROOT (a CMake or environment variable) says, else beside the toolkit or in
  # the system's folders. NCCL_ROOT may be pip's nvidia-nccl package, which ships libnccl.so.2
  # without the libnccl.so link: hence the second name, tried in each folder before the next.
  set(_nccl_roots)
  foreach(_root "${NCCL_ROOT}" "$ENV{NCCL_ROOT}")
    if(_root)
      list(APPEND _nccl_roots "${_root}")
    endif()
  endforeach()
  list(TRANSFORM _nccl_roots APPEND /include OUTPUT_VARIABLE _nccl_include_hints)
  list(TRANSFORM _nccl_roots APPEND /lib OUTPUT_VARIABLE _nccl_library_hints)
  find_path(MGPU_NCCL_INCLUDE nccl.h HINTS ${_nccl_include_hints} ${CUDAToolkit_INCLUDE_DIRS})
  find_library(MGPU_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
               HINTS ${_nccl_library_hints} ${CUDAToolkit_LIBRARY_DIR})
  if(MGPU_NCCL_INCLUDE AND MGPU_NCCL_LIBRARY)
    set(MGPU_HAVE_NCCL ON)
  endif()
else()
  # Thrust and CUB are header-only: take them from the CUDA toolkit's CCCL if it is installed,
  # else from Debian's libthrust-dev.
  find_path(MGPU_THRUST_INCLUDE thrust/version.h
            HINTS /usr/local/cuda/include/cccl /usr/local/cuda/include /usr/include)
  if(NOT MGPU_THRUST_INCLUDE)
    message(FATAL_ERROR "Thrust headers not found: install the CUDA toolkit or Debian's libthrust-dev")
  endif()
  find_package(OpenMP REQUIRED)
  # OpenBLAS built with OpenMP shares OpenMP's thread pool with our Thrust loops; the pthread
  # build would keep its own threads spinning next to OpenMP's on the same cores.
  find_path(MGPU_CBLAS_INCLUDE cblas.h
            HINTS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/aarch64-linux-gnu/openblas-openmp
            PATH_SUFFIXES openblas)
  find_library(MGPU_OPENBLAS openblas
               HINTS /usr/lib/x86_64-linux-gnu/openblas-openmp /usr/lib/aarch64-linux-gnu/openblas-openmp)
  if(NOT MGPU_CBLAS_INCLUDE OR NOT MGPU_OPENBLAS)
    message(FATAL_ERROR "OpenBLAS not found: apt-get install libopenblas-openmp-dev")
  endif()
  set(MGPU_BLAS_NAME "OpenBLAS (${MGPU_OPENBLAS})")
  target_include_directories(mgpu_backend SYSTEM INTERFACE ${MGPU_THRUST_INCLUDE} ${MGPU_CBLAS_INCLUDE})
  target_compile_definitions(mgpu_backend INTERFACE MGPU_CUDA=0
                             THRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP)
  find_package(Threads REQUIRED)  # each cpu device's stream has a worker thread
  target_link_libraries(mgpu_backend INTERFACE OpenMP::OpenMP_CXX ${MGPU_OPENBLAS} Threads::Threads)
  if(MGPU_NATIVE)
    target_compile_options(mgpu_backend INTERFACE -march=native)
  endif()
  if(MGPU_GPU_MAPPING)  # common/backend.h: kGpuMapping
    target_compile_definitions(mgpu_backend INTERFACE MGPU_GPU_MAPPING=1)
  endif()
endif()
target_compile_options(mgpu_backend INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)

# Files ending in .cu hold the code both backends share (Thrust algorithms, functors):
# nvcc compiles them in the cuda build, the host compiler (as C++) in the cpu build.
function(mgpu_device_sources)
  if(MGPU_BACKEND_RESOLVED STREQUAL "cuda")
    set_source_files_properties(${ARGN} PROPERTIES LANGUAGE CUDA)
  else()
    set_source_files_properties(${ARGN} PROPERTIES LANGUAGE CXX)
  endif()
endfunction()
