# Finds rdma-core's user-space libraries and defines the imported targets
#   RDMA::ibverbs   libibverbs and <infiniband/verbs.h>          (required)
#   RDMA::rdmacm    librdmacm and <rdma/rdma_cma.h>              (when present;
#                   RDMA_rdmacm_FOUND says whether it is)
# Installed with gpuverbs' CMake package, so consumers find the same way.
include(FindPackageHandleStandardArgs)

find_path(RDMA_IBVERBS_INCLUDE_DIR infiniband/verbs.h)
find_library(RDMA_IBVERBS_LIBRARY ibverbs)
find_path(RDMA_RDMACM_INCLUDE_DIR rdma/rdma_cma.h)
find_library(RDMA_RDMACM_LIBRARY rdmacm)

find_package_handle_standard_args(RDMA
    REQUIRED_VARS RDMA_IBVERBS_LIBRARY RDMA_IBVERBS_INCLUDE_DIR
    REASON_FAILURE_MESSAGE "install rdma-core's development files (Debian: libibverbs-dev librdmacm-dev)")

if(RDMA_FOUND)
    if(NOT TARGET RDMA::ibverbs)
        add_library(RDMA::ibverbs UNKNOWN IMPORTED)
        set_target_properties(RDMA::ibverbs PROPERTIES
            IMPORTED_LOCATION "${RDMA_IBVERBS_LIBRARY}"
            INTERFACE_INCLUDE_DIRECTORIES "${RDMA_IBVERBS_INCLUDE_DIR}")
    endif()
    set(RDMA_rdmacm_FOUND OFF)
    if(RDMA_RDMACM_LIBRARY AND RDMA_RDMACM_INCLUDE_DIR)
        set(RDMA_rdmacm_FOUND ON)
    endif()
    if(RDMA_rdmacm_FOUND AND NOT TARGET RDMA::rdmacm)
        add_library(RDMA::rdmacm UNKNOWN IMPORTED)
        set_target_properties(RDMA::rdmacm PROPERTIES
            IMPORTED_LOCATION "${RDMA_RDMACM_LIBRARY}"
            INTERFACE_INCLUDE_DIRECTORIES "${RDMA_RDMACM_INCLUDE_DIR}"
            INTERFACE_LINK_LIBRARIES RDMA::ibverbs)
    endif()
endif()
mark_as_advanced(RDMA_IBVERBS_INCLUDE_DIR RDMA_IBVERBS_LIBRARY RDMA_RDMACM_INCLUDE_DIR RDMA_RDMACM_LIBRARY)
