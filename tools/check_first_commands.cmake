# A README's first command builds only what its run needs. The top README's first-result block
# and each chapter README's first block that builds (`cmake --build <dir> ...`) must
#   1. name what they build (`--target A B ...`): a bare `cmake --build` compiles every chapter,
#      every test, the hidden tests and the classroom tools before the first program runs;
#   2. name only programs the block then runs (`<dir>/bin/A`);
#   3. pull in, through CMake's own dependency listing (the file API's codemodel of a build
#      configured as the block configures it), nothing from tests/ or tools/ and nothing of a
#      chapter later than the latest the block runs: chapter 01's first result never waits for
#      chapter 10's kernels.
#
#   cmake -DROOT=<repository> -DSCRATCH=<empty folder> -P tools/check_first_commands.cmake
#
# It first sees each rule fail on a case made to break it (a check that cannot fail proves
# nothing), then checks the READMEs. About 10 s on two cores (one configure, no compiling).
cmake_minimum_required(VERSION 3.25)
if(NOT DEFINED ROOT OR NOT DEFINED SCRATCH)
  message(FATAL_ERROR "usage: cmake -DROOT=<repository> -DSCRATCH=<empty folder> -P tools/check_first_commands.cmake")
endif()

# Known exceptions, each "<program>: <target>: why". Chapter 10 adds its kernels to 09_resnet's
# link line (chapters/10_fast_kernels/CMakeLists.txt); until chapter 09 stands alone, its first
# build compiles them. An exception that no longer happens fails the check: remove it here.
set(known_exceptions
    "09_resnet: mgpu_fast_kernels: chapter 10 plugs its kernel tables into 09_resnet's link line")

# --- The README side -------------------------------------------------------------------------

# Sets ${out} to the first ```sh block of ${readme} that runs `cmake --build` (joined lines, with
# a backslash-newline continued line read as one line), or "" when none does.
function(first_build_block readme out)
  file(STRINGS "${readme}" lines)
  set(block "")
  set(inside FALSE)
  foreach(line IN LISTS lines)
    if(NOT inside AND line MATCHES "^```sh")
      set(inside TRUE)
      set(block "")
    elseif(inside AND line MATCHES "^```")
      set(inside FALSE)
      if(block MATCHES "cmake --build")
        set(${out} "${block}" PARENT_SCOPE)
        return()
      endif()
    elseif(inside)
      string(APPEND block "${line}\n")
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# Reads a block: sets ${prefix}_build_dir, ${prefix}_targets (what `--target` names, "" when it
# names nothing), ${prefix}_programs (what the block runs from <build dir>/bin) and appends to
# ${prefix}_problems what breaks rules 1 and 2.
function(read_block text prefix)
  set(problems "")
  string(REGEX MATCH "cmake --build ([^ \n]+)([^\n&|;#]*)" build "${text}")
  set(dir "${CMAKE_MATCH_1}")
  set(rest "${CMAKE_MATCH_2}")
  set(targets "")
  if(rest MATCHES "--target ([^-]*)")
    string(STRIP "${CMAKE_MATCH_1}" named)
    separate_arguments(targets UNIX_COMMAND "${named}")
  endif()
  string(REGEX MATCHALL "${dir}/bin/[A-Za-z0-9_]+" runs "${text}")
  set(programs "")
  foreach(run IN LISTS runs)
    string(REGEX REPLACE ".*/bin/" "" program "${run}")
    list(APPEND programs ${program})
  endforeach()
  list(REMOVE_DUPLICATES programs)
  if(NOT targets)
    list(APPEND problems "`cmake --build ${dir}` names no --target: it builds everything before the first run")
  endif()
  foreach(target IN LISTS targets)
    if(NOT target IN_LIST programs)
      list(APPEND problems "--target ${target}: the block never runs ${dir}/bin/${target}")
    endif()
  endforeach()
  set(${prefix}_build_dir "${dir}" PARENT_SCOPE)
  set(${prefix}_targets "${targets}" PARENT_SCOPE)
  set(${prefix}_programs "${programs}" PARENT_SCOPE)
  set(${prefix}_problems "${problems}" PARENT_SCOPE)
endfunction()

# --- CMake's dependency listing --------------------------------------------------------------

# Loads the codemodel of the build in ${build}: for every target, target_dir_<name> (its source
# folder, relative to the repository) and target_file_<name> (its reply file, read for its
# dependencies when needed); target_name_<id> maps ids to names. Global, for the functions below.
macro(load_codemodel build)
  file(GLOB index_files "${build}/.cmake/api/v1/reply/index-*.json")
  if(NOT index_files)
    message(FATAL_ERROR "check_first_commands: configuring ${build} wrote no file-API reply")
  endif()
  list(GET index_files 0 index_file)
  file(READ "${index_file}" index)
  string(JSON codemodel_file GET "${index}" reply "codemodel-v2" jsonFile)
  file(READ "${build}/.cmake/api/v1/reply/${codemodel_file}" codemodel)
  string(JSON directories GET "${codemodel}" configurations 0 directories)
  string(JSON targets GET "${codemodel}" configurations 0 targets)
  string(JSON target_count LENGTH "${targets}")
  math(EXPR last "${target_count} - 1")
  foreach(i RANGE ${last})
    string(JSON name GET "${targets}" ${i} name)
    string(JSON id GET "${targets}" ${i} id)
    string(JSON directory GET "${targets}" ${i} directoryIndex)
    string(JSON source GET "${directories}" ${directory} source)
    string(JSON json_file GET "${targets}" ${i} jsonFile)
    set(target_dir_${name} "${source}")
    set(target_file_${name} "${build}/.cmake/api/v1/reply/${json_file}")
    set(target_name_${id} "${name}")
  endforeach()
endmacro()

# Sets ${out} to the targets that building ${start} builds: the targets, and everything they
# depend on, as CMake lists it (link libraries, object libraries, add_dependencies).
function(dependency_closure start out)
  set(seen "")
  set(todo ${start})
  while(todo)
    list(POP_FRONT todo name)
    if(name IN_LIST seen)
      continue()
    endif()
    if(NOT DEFINED target_file_${name})
      message(FATAL_ERROR "check_first_commands: no target named ${name} in the build")
    endif()
    list(APPEND seen ${name})
    file(READ "${target_file_${name}}" target)
    string(JSON count ERROR_VARIABLE none LENGTH "${target}" dependencies)
    if(none OR count EQUAL 0)
      continue()
    endif()
    math(EXPR last "${count} - 1")
    foreach(i RANGE ${last})
      string(JSON id GET "${target}" dependencies ${i} id)
      list(APPEND todo "${target_name_${id}}")
    endforeach()
  endwhile()
  set(${out} "${seen}" PARENT_SCOPE)
endfunction()

# Sets ${out} to "<target> (<folder>)" for each target of ${closure} that a first run of chapters
# up to ${chapter} (two digits) has no use for: one in tests/ or tools/, or in a later chapter.
function(unneeded_targets closure chapter out)
  set(found "")
  foreach(name IN LISTS closure)
    set(dir "${target_dir_${name}}")
    if(dir MATCHES "^(tests|tools)(/|$)")
      list(APPEND found "${name} (${dir})")
    elseif(dir MATCHES "^chapters/([0-9][0-9])_")
      if(CMAKE_MATCH_1 GREATER chapter)
        list(APPEND found "${name} (${dir})")
      endif()
    endif()
  endforeach()
  set(${out} "${found}" PARENT_SCOPE)
endfunction()

# --- Configure a build as the READMEs do (`cmake -S . -B build`), asking for the codemodel ---

file(REMOVE_RECURSE "${SCRATCH}")
file(WRITE "${SCRATCH}/.cmake/api/v1/query/codemodel-v2" "")
execute_process(COMMAND ${CMAKE_COMMAND} -S "${ROOT}" -B "${SCRATCH}"
                RESULT_VARIABLE configured OUTPUT_VARIABLE configure_log ERROR_VARIABLE configure_log)
if(NOT configured EQUAL 0)
  message(FATAL_ERROR "check_first_commands: `cmake -S . -B build` failed (status ${configured}):\n${configure_log}")
endif()
load_codemodel("${SCRATCH}")

# --- 1. Each rule seen to fail on a case made to break it -----------------------------------

read_block("cmake -S . -B build && cmake --build build -j2\nbuild/bin/01_lenet\n" bare)
read_block("cmake --build build --target 01_lenet 02_data_parallel && build/bin/01_lenet\n" extra)
dependency_closure(test_lenet test_closure)
unneeded_targets("${test_closure}" 01 test_unneeded)
if(NOT bare_problems MATCHES "names no --target" OR NOT extra_problems MATCHES "never runs build/bin/02_data_parallel"
   OR NOT test_unneeded MATCHES "test_lenet \\(tests\\)")
  message(FATAL_ERROR "check_first_commands: a rule did not fail on the case made to break it "
                      "(bare build: '${bare_problems}'; extra target: '${extra_problems}'; "
                      "test_lenet's closure: '${test_unneeded}'): the check itself is broken")
endif()

# --- 2. The READMEs ---------------------------------------------------------------------------

file(GLOB chapter_readmes RELATIVE "${ROOT}" "${ROOT}/chapters/[0-9][0-9]_*/README.md")
set(failures "")
set(exceptions_seen "")
set(checked 0)
foreach(readme README.md ${chapter_readmes})
  first_build_block("${ROOT}/${readme}" block)
  if(block STREQUAL "")
    list(APPEND failures "${readme}: no ```sh block runs `cmake --build`")
    continue()
  endif()
  read_block("${block}" this)
  foreach(problem IN LISTS this_problems)
    list(APPEND failures "${readme}: ${problem}")
  endforeach()
  if(NOT this_targets)
    continue()
  endif()
  # The latest chapter the block runs bounds what it may build.
  set(latest 00)
  foreach(target IN LISTS this_targets)
    if(target MATCHES "^([0-9][0-9])_" AND CMAKE_MATCH_1 GREATER latest)
      set(latest ${CMAKE_MATCH_1})
    endif()
  endforeach()
  foreach(target IN LISTS this_targets)
    dependency_closure(${target} closure)
    unneeded_targets("${closure}" ${latest} unneeded)
    foreach(entry IN LISTS unneeded)
      string(REGEX REPLACE " \\(.*" "" name "${entry}")
      set(excused FALSE)
      foreach(exception IN LISTS known_exceptions)
        if(exception MATCHES "^${target}: ${name}: ")
          set(excused TRUE)
          list(APPEND exceptions_seen "${exception}")
        endif()
      endforeach()
      if(NOT excused)
        list(APPEND failures "${readme}: --target ${target} also builds ${entry}, which its run does not use")
      endif()
    endforeach()
  endforeach()
  math(EXPR checked "${checked} + 1")
  list(JOIN this_targets " " shown)
  message(STATUS "${readme}: builds ${shown}")
endforeach()
foreach(exception IN LISTS known_exceptions)
  if(NOT exception IN_LIST exceptions_seen)
    list(APPEND failures "known exception no longer seen, remove it from tools/check_first_commands.cmake: ${exception}")
  endif()
endforeach()
file(REMOVE_RECURSE "${SCRATCH}")
if(failures)
  list(JOIN failures "\n  " lines)
  message(FATAL_ERROR "a README's first command builds more than its run uses:\n  ${lines}")
endif()
list(LENGTH known_exceptions exception_count)
message(STATUS "first commands: ${checked} READMEs build only what their first run uses "
               "(${exception_count} known exception; each rule seen failing on its made-up case)")
