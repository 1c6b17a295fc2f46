# Chapter 05: two ranks with the same options but different data must stop, naming the set.
#   cmake -DLAUNCH="<mpiexec> -n 1 <flags>" -DPROGRAM=<05_multi_process> -DSHORT="<options>"
#         -DNUMPROC_FLAG=-n -DOUT=<folder> -DSOURCE_DIR=<repository> -P ranks_data_check.cmake
# Rank 0 finds Fashion-MNIST as the program does; rank 1 gets --data-dir OUT/swapped, whose
# training files are links to the test set's files: a valid data set, but not the same one.
if(NOT LAUNCH MATCHES "^[^ ]")
  message("mpiexec not found: the tests that launch several processes cannot run")
  return()
endif()
# Where the program would look (common/fashion_mnist.cpp, find_fashion_mnist).
set(found "")
set(places "${SOURCE_DIR}/data/fashion-mnist" /usr/share/datasets/fashion-mnist)
if(NOT "$ENV{FASHION_MNIST_DIR}" STREQUAL "")
  set(places "$ENV{FASHION_MNIST_DIR}")  # the program's choice when set
endif()
foreach(dir ${places})
  if(NOT found AND dir AND EXISTS "${dir}/t10k-images-idx3-ubyte.gz" AND EXISTS "${dir}/train-images-idx3-ubyte.gz")
    set(found "${dir}")
  endif()
endforeach()
if(NOT found)
  message("Fashion-MNIST not found: the data check needs the real data set")
  return()
endif()
set(swapped "${OUT}/swapped")
file(REMOVE_RECURSE "${swapped}")
file(MAKE_DIRECTORY "${swapped}")
foreach(split train t10k)
  foreach(kind images-idx3 labels-idx1)
    file(CREATE_LINK "${found}/t10k-${kind}-ubyte.gz" "${swapped}/${split}-${kind}-ubyte.gz" SYMBOLIC)
  endforeach()
endforeach()

separate_arguments(launch UNIX_COMMAND "${LAUNCH}")
list(POP_FRONT launch CMD)
list(JOIN launch " " ARGS)
string(APPEND ARGS " ${PROGRAM} ${SHORT} --data-dir ${found}"
                  " : ${NUMPROC_FLAG} 1 ${PROGRAM} ${SHORT} --data-dir ${swapped}")
set(CODE 1)
set(one_set "512 images of 28x28 \\(checksum [0-9a-f]+\\)")
set(EXPECT "ranks disagree on the training set: rank 0 has ${one_set}, rank 1 has ${one_set}; every rank must read the same data")
include(${CMAKE_CURRENT_LIST_DIR}/mpi_run.cmake)
