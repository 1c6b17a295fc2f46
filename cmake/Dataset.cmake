# Finds Fashion-MNIST at configure time in the order the programs use (see data/README.md)
# and, where none has it, fetches it into data/fashion-mnist/ with checksums verified.
# Sets MGPU_DATA_DIR (empty when not found). Programs search again at run time; this is
# only so that a fresh checkout has the data before the first run.
set(_files train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
           t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
set(MGPU_DATA_DIR "")
foreach(_dir "$ENV{FASHION_MNIST_DIR}" "${CMAKE_SOURCE_DIR}/data/fashion-mnist"
             "/usr/share/datasets/fashion-mnist")
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
if(NOT MGPU_DATA_DIR AND MGPU_FETCH_DATA)
  execute_process(COMMAND ${CMAKE_COMMAND} -DDEST=${CMAKE_SOURCE_DIR}/data/fashion-mnist
                          -P ${CMAKE_SOURCE_DIR}/data/fetch.cmake
                  RESULT_VARIABLE _fetch_rc)
  if(_fetch_rc EQUAL 0)
    set(MGPU_DATA_DIR "${CMAKE_SOURCE_DIR}/data/fashion-mnist")
  endif()
endif()
