# cmake -DDEST=data/fashion-mnist -P data/fetch.cmake
# Downloads the four Fashion-MNIST files from Zalando Research's mirror and verifies each
# against the MD5 sums published in https://github.com/zalandoresearch/fashion-mnist (README).
# A file that fails its check is deleted, and the script exits non-zero naming it.
if(NOT DEST)
  set(DEST "${CMAKE_CURRENT_LIST_DIR}/fashion-mnist")
endif()
set(BASE "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com")
set(MD5_train-images-idx3-ubyte.gz 8d4fb7e6c68d591d4c3dfef9ec88bf0d)
set(MD5_train-labels-idx1-ubyte.gz 25c81989df183df01b3e8a0aad5dffbe)
set(MD5_t10k-images-idx3-ubyte.gz  bef4ecab320f06d8554ea6380940ec79)
set(MD5_t10k-labels-idx1-ubyte.gz  bb300cfdad3c16e7a12a480ee83cd310)

file(MAKE_DIRECTORY "${DEST}")
foreach(f train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
          t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
  message(STATUS "fetching ${BASE}/${f}")
  file(DOWNLOAD "${BASE}/${f}" "${DEST}/${f}.part" TIMEOUT 120 STATUS st)
  list(GET st 0 code)
  if(NOT code EQUAL 0)
    file(REMOVE "${DEST}/${f}.part")
    message(FATAL_ERROR "could not download ${f}: ${st} (no network? install Debian's dataset-fashion-mnist instead)")
  endif()
  file(MD5 "${DEST}/${f}.part" got)
  if(NOT got STREQUAL "${MD5_${f}}")
    file(REMOVE "${DEST}/${f}.part")
    message(FATAL_ERROR "${f}: MD5 ${got} does not match the published ${MD5_${f}}; file deleted")
  endif()
  file(RENAME "${DEST}/${f}.part" "${DEST}/${f}")
endforeach()
message(STATUS "Fashion-MNIST is in ${DEST}")
