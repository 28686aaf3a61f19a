# Third-party dependencies, all found through their own CMake configs (or
# pkg-config) so that Debian's packages and upstream installs both work.
#
# LibTorch: Debian's libtorch-dev (1.13, CPU) by default. For a cluster build,
# point CMAKE_PREFIX_PATH at an upstream LibTorch 2.x (e.g. the `share/cmake`
# directory inside a PyTorch install); CUDA is then detected from it: the
# exported torch_cuda target of a CUDA LibTorch, whose Caffe2 config needs the
# CUDA toolkit (nvcc) and, for a wheel's LibTorch, the cuDNN paths
# (scripts/gpu/build.sh passes them; docs/gpu.md).
find_package(Torch REQUIRED)
set(RELAY_HAS_CUDA OFF)
if(TARGET torch_cuda OR TORCH_CUDA_LIBRARIES)
  set(RELAY_HAS_CUDA ON)
endif()
message(STATUS "relay: LibTorch ${Torch_VERSION} (CUDA: ${RELAY_HAS_CUDA})")

# TORCH_LIBRARIES is a plain list; wrap it so targets can link one name and
# pick up the required ABI flags.
add_library(relay_torch INTERFACE)
target_link_libraries(relay_torch INTERFACE ${TORCH_LIBRARIES})
separate_arguments(_relay_torch_flags UNIX_COMMAND "${TORCH_CXX_FLAGS}")
target_compile_options(relay_torch INTERFACE ${_relay_torch_flags})
if(RELAY_HAS_CUDA)
  target_compile_definitions(relay_torch INTERFACE RELAY_WITH_CUDA=1)
endif()

find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(Protobuf REQUIRED)
# relay's generated code links the libprotobuf whose protoc generated it, by
# file. A LibTorch 2.x config may define protobuf::libprotobuf first (torch
# carries its own protobuf inside libtorch); FindProtobuf then keeps that
# target, and on the GPU machine (PyTorch 2.11 wheel) it linked no library.
if(Protobuf_LIBRARY AND EXISTS "${Protobuf_LIBRARY}")
  set(RELAY_PROTOBUF_LIBRARY "${Protobuf_LIBRARY}")
else()
  find_library(RELAY_PROTOBUF_LIBRARY NAMES protobuf REQUIRED)
endif()
message(STATUS "relay: protobuf ${Protobuf_VERSION}: ${RELAY_PROTOBUF_LIBRARY}")
find_package(gRPC CONFIG REQUIRED)
# OpenSSL's libcrypto: relay_comm checks a TLS certificate and key before
# handing them to gRPC (which links OpenSSL on Debian: libgrpc-dev depends on
# libssl-dev), so a mismatch is reported as one, not as "cannot listen".
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(spdlog REQUIRED)
find_package(fmt REQUIRED)
# A LibTorch 2.x from a PyTorch wheel may ship fmt's headers (a newer fmt
# than the one spdlog was built against). relay compiles against the fmt it
# links, so fmt's own include directory goes before LibTorch's.
get_target_property(_relay_fmt_include fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
foreach(_relay_torch_include IN LISTS TORCH_INCLUDE_DIRS)
  if(EXISTS "${_relay_torch_include}/fmt/format.h"
     AND NOT "${_relay_torch_include}" IN_LIST _relay_fmt_include)
    target_include_directories(relay_torch SYSTEM BEFORE INTERFACE ${_relay_fmt_include})
    message(STATUS "relay: LibTorch ships fmt headers; ${_relay_fmt_include} comes first")
    break()
  endif()
endforeach()
find_package(yaml-cpp REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 CONFIG REQUIRED)

find_package(PkgConfig REQUIRED)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# PCRE2 (8-bit code units): the jsonl task's regex verifier.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# RocksDB: the rollout store (module store), linked as the shared library.
pkg_check_modules(ROCKSDB REQUIRED IMPORTED_TARGET rocksdb)
# cpp-httplib (Debian builds it as a library): the trainer's /metrics endpoint.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# Its Cflags turn on CPPHTTPLIB_OPENSSL_SUPPORT, so code that includes
# httplib.h calls OpenSSL itself (0.18, Debian trixie's, does so from inline
# code), but its .pc names OpenSSL only as a private requirement, which a
# shared library's users do not get: link it here.
if("-DCPPHTTPLIB_OPENSSL_SUPPORT" IN_LIST HTTPLIB_CFLAGS)
  find_package(OpenSSL REQUIRED)
  target_link_libraries(PkgConfig::HTTPLIB INTERFACE OpenSSL::SSL OpenSSL::Crypto)
endif()

if(RELAY_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()

set(RELAY_PROTOC $<TARGET_FILE:protobuf::protoc>)
find_program(RELAY_GRPC_CPP_PLUGIN NAMES grpc_cpp_plugin REQUIRED)
