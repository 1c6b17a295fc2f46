# Finds Fashion-MNIST at configure time in the order the programs use (see data/README.md)
# and, where none has it, fetches it into data/fashion-mnist/ with checksums verified.
# Sets MGPU_DATA_DIR (empty when not found). Programs search again at run time; this is
# only so that a fresh checkout has the data before the first run.
set(_files train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
           t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
set(MGPU_DATA_DIR "")
# $FASHION_MNIST_DIR, when set, is the programs' choice (common/fashion_mnist.h): nothing is
# fetched in its place, and a folder without the files is said now, as the programs will say it.
set(_places "${CMAKE_SOURCE_DIR}/data/fashion-mnist" "/usr/share/datasets/fashion-mnist")
if(NOT "$ENV{FASHION_MNIST_DIR}" STREQUAL "")
  set(_places "$ENV{FASHION_MNIST_DIR}")
endif()
foreach(_dir ${_places})
  if(NOT _dir)
    continue()
  endif()
  set(_all_there TRUE)  # the first directory with all four files, as the programs take it
  foreach(_file ${_files})
    if(NOT EXISTS "${_dir}/${_file}")
      set(_all_there FALSE)
    endif()
  endforeach()
  if(_all_there)
    set(MGPU_DATA_DIR "${_dir}")
    break()
  endif()
endforeach()

option(MGPU_FETCH_DATA "Download Fashion-MNIST into data/ when it is not found" ON)
if(NOT MGPU_DATA_DIR AND NOT "$ENV{FASHION_MNIST_DIR}" STREQUAL "")
  message(WARNING "FASHION_MNIST_DIR=$ENV{FASHION_MNIST_DIR} does not hold Fashion-MNIST's four files: the "
                  "programs will refuse it (they never pass it over for another place). Put the files there, "
                  "or unset FASHION_MNIST_DIR.")
elseif(NOT MGPU_DATA_DIR AND MGPU_FETCH_DATA)
  execute_process(COMMAND ${CMAKE_COMMAND} -DDEST=${CMAKE_SOURCE_DIR}/data/fashion-mnist
                          -P ${CMAKE_SOURCE_DIR}/data/fetch.cmake
                  RESULT_VARIABLE _fetch_rc)
  if(_fetch_rc EQUAL 0)
    set(MGPU_DATA_DIR "${CMAKE_SOURCE_DIR}/data/fashion-mnist")
  endif()
endif()
