# Host dependencies (Debian 12: liblmdb-dev libturbojpeg0-dev libxxhash-dev libzstd-dev;
# optional: libsnappy-dev zlib1g-dev for the Parquet reader's SNAPPY and GZIP pages).
find_package(Threads REQUIRED)

find_path(LMDB_INCLUDE_DIR lmdb.h REQUIRED)
find_library(LMDB_LIBRARY lmdb REQUIRED)
find_path(TURBOJPEG_INCLUDE_DIR turbojpeg.h REQUIRED)
find_library(TURBOJPEG_LIBRARY turbojpeg REQUIRED)
find_path(JPEG_INCLUDE_DIR jpeglib.h REQUIRED)
find_library(JPEG_LIBRARY jpeg REQUIRED)
find_path(XXHASH_INCLUDE_DIR xxhash.h REQUIRED)
find_library(XXHASH_LIBRARY xxhash REQUIRED)
find_path(ZSTD_INCLUDE_DIR zstd.h REQUIRED)
find_library(ZSTD_LIBRARY zstd REQUIRED)

add_library(lf_deps INTERFACE)
target_include_directories(lf_deps INTERFACE ${LMDB_INCLUDE_DIR} ${TURBOJPEG_INCLUDE_DIR}
                           ${JPEG_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR} ${ZSTD_INCLUDE_DIR})
target_link_libraries(lf_deps INTERFACE ${LMDB_LIBRARY} ${TURBOJPEG_LIBRARY} ${JPEG_LIBRARY}
                      ${XXHASH_LIBRARY} ${ZSTD_LIBRARY})

# Optional codecs of the Parquet reader (src/dataset/parquet): without one, pages in that codec are an
# Unimplemented error naming the file and column; everything else still reads.
find_path(SNAPPY_INCLUDE_DIR snappy-c.h)
find_library(SNAPPY_LIBRARY snappy)
set(LF_HAVE_SNAPPY OFF)
if(SNAPPY_INCLUDE_DIR AND SNAPPY_LIBRARY)
  set(LF_HAVE_SNAPPY ON)
  target_include_directories(lf_deps INTERFACE ${SNAPPY_INCLUDE_DIR})
  target_link_libraries(lf_deps INTERFACE ${SNAPPY_LIBRARY})
  target_compile_definitions(lf_deps INTERFACE LOONGFORGE_WITH_SNAPPY=1)
else()
  message(WARNING "libsnappy not found (apt-get install libsnappy-dev): Parquet SNAPPY pages unsupported")
endif()
find_package(ZLIB)
set(LF_HAVE_ZLIB OFF)
if(ZLIB_FOUND)
  set(LF_HAVE_ZLIB ON)
  target_link_libraries(lf_deps INTERFACE ZLIB::ZLIB)
  target_compile_definitions(lf_deps INTERFACE LOONGFORGE_WITH_ZLIB=1)
else()
  message(WARNING "zlib not found (apt-get install zlib1g-dev): Parquet GZIP pages unsupported")
endif()
