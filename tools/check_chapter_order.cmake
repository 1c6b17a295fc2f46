# Chapters build on earlier chapters, never on later ones: a chapter may use common/ and the
# chapters before it. This script fails when a chapter's sources or build file reach into a later
# chapter, by a path (an #include "../10_fast_kernels/kernels.h", a CMake source
# ../10_fast_kernels/kernels.cu, a path chapters/10_fast_kernels/...) or by naming a library a
# later chapter's CMakeLists.txt defines (target_link_libraries(... mgpu_fast_kernels)). A later
# chapter plugs into an earlier one's program through an interface the earlier one declares
# (chapter 10's tables of layer kernels into 09_resnet: chapters/10_fast_kernels/CMakeLists.txt).
# Mentions in prose (READMEs, comments naming a later program to run next) are not dependencies
# and are not read: only C++/CUDA sources and CMakeLists.txt.
#
#   cmake -DROOT=<repository> -P tools/check_chapter_order.cmake
#
# It first checks itself on a made-up tree with one dependency of each kind, which it must find
# (a check that could not fail would prove nothing); then the repository's chapters.
cmake_minimum_required(VERSION 3.25)

# Sets ${out} to the list of "file: what" for every dependency of a chapter on a later one under
# `chapters`, a folder of NN_name chapter folders.
function(find_later_dependencies chapters out)
  # The chapter folders, by name (NN_name; the first two characters are the chapter's number).
  file(GLOB entries RELATIVE "${chapters}" "${chapters}/[0-9][0-9]_*")
  set(names "")
  foreach(name IN LISTS entries)
    if(IS_DIRECTORY "${chapters}/${name}")
      list(APPEND names "${name}")
    endif()
  endforeach()
  # The libraries each chapter defines, by number.
  set(numbers "")
  foreach(name IN LISTS names)
    string(SUBSTRING "${name}" 0 2 n)
    list(APPEND numbers ${n})
    set(libraries_${n} "")
    if(EXISTS "${chapters}/${name}/CMakeLists.txt")
      file(READ "${chapters}/${name}/CMakeLists.txt" text)
      string(REGEX MATCHALL "add_library\\([A-Za-z0-9_]+" defs "${text}")
      foreach(def IN LISTS defs)
        string(REPLACE "add_library(" "" lib "${def}")
        list(APPEND libraries_${n} ${lib})
      endforeach()
    endif()
  endforeach()
  set(found "")
  foreach(name IN LISTS names)
    string(SUBSTRING "${name}" 0 2 own)
    set(dir "${chapters}/${name}")
    file(GLOB_RECURSE files "${dir}/*.cpp" "${dir}/*.h" "${dir}/*.cu" "${dir}/*.cuh" "${dir}/CMakeLists.txt")
    foreach(file IN LISTS files)
      file(READ "${file}" text)
      file(RELATIVE_PATH shown "${chapters}" "${file}")
      # Paths into a chapter folder: ../NN_name or chapters/NN_name.
      string(REGEX MATCHALL "(\\.\\./|chapters/)[0-9][0-9]_[A-Za-z0-9_]+" paths "${text}")
      foreach(path IN LISTS paths)
        string(REGEX REPLACE "^(\\.\\./|chapters/)" "" target "${path}")
        string(SUBSTRING "${target}" 0 2 n)
        if(n GREATER own)
          list(APPEND found "${shown}: ${path}")
        endif()
      endforeach()
      # A later chapter's library, named in this chapter's build file.
      get_filename_component(base "${file}" NAME)
      if(base STREQUAL "CMakeLists.txt")
        foreach(n IN LISTS numbers)
          if(n GREATER own)
            foreach(lib IN LISTS libraries_${n})
              string(REGEX MATCH "(^|[^A-Za-z0-9_])${lib}([^A-Za-z0-9_]|$)" hit "${text}")
              if(hit)
                list(APPEND found "${shown}: ${lib} (chapter ${n}'s library)")
              endif()
            endforeach()
          endif()
        endforeach()
      endif()
    endforeach()
  endforeach()
  list(REMOVE_DUPLICATES found)
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

if(NOT DEFINED ROOT)
  message(FATAL_ERROR "usage: cmake -DROOT=<repository> -P tools/check_chapter_order.cmake")
endif()

# 1. The check on a made-up tree: 01_first reaches into 02_second three ways; 02_second uses
#    01_first (allowed) and names 01's library (allowed).
string(RANDOM LENGTH 8 salt)
set(fake "${CMAKE_CURRENT_BINARY_DIR}/chapter_order_selftest_${salt}")
file(REMOVE_RECURSE "${fake}")
file(WRITE "${fake}/01_first/main.cpp" "#include \"../02_second/later.h\"\n")
file(WRITE "${fake}/01_first/CMakeLists.txt"
     "add_library(first_lib STATIC a.cpp ../02_second/b.cu)\ntarget_link_libraries(first_lib PRIVATE second_lib)\n")
file(WRITE "${fake}/02_second/CMakeLists.txt"
     "add_library(second_lib STATIC ../01_first/a.cpp)\ntarget_link_libraries(second_lib PUBLIC first_lib)\n")
file(WRITE "${fake}/02_second/later.h" "#include \"../01_first/earlier.h\"\n")
find_later_dependencies("${fake}" planted)
file(REMOVE_RECURSE "${fake}")
list(LENGTH planted planted_count)
if(NOT planted_count EQUAL 3)
  message(FATAL_ERROR "check_chapter_order: on its made-up tree the check found ${planted_count} of the 3 planted "
                      "dependencies on a later chapter (${planted}): the check itself is broken")
endif()

# 2. The repository's chapters.
find_later_dependencies("${ROOT}/chapters" found)
if(found)
  list(JOIN found "\n  " lines)
  message(FATAL_ERROR "a chapter depends on a later chapter (a chapter may use common/ and earlier chapters only):\n  ${lines}")
endif()
message(STATUS "chapter order: no chapter depends on a later one (self-check found its 3 planted dependencies)")
