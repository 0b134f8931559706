# Inside a wheel everything lives in the flashcute package directory, which then doubles as a
# CMake prefix (flashcute.cmake_prefix_path()); a plain `cmake --install` uses GNU dirs.
if(SKBUILD)
  set(FLASHCUTE_INSTALL_LIBDIR flashcute/lib)
  set(FLASHCUTE_INSTALL_INCLUDEDIR flashcute/include)
  set(FLASHCUTE_INSTALL_CMAKEDIR flashcute/lib/cmake/flashcute)
else()
  include(GNUInstallDirs)
  set(FLASHCUTE_INSTALL_LIBDIR ${CMAKE_INSTALL_LIBDIR})
  set(FLASHCUTE_INSTALL_INCLUDEDIR ${CMAKE_INSTALL_INCLUDEDIR})
  set(FLASHCUTE_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashcute)
endif()
