# --- Chapter 09: ResNet-18 from a layer library (included by tests/CMakeLists.txt).
if(EXISTS ${CMAKE_CURRENT_SOURCE_DIR}/test_resnet_layers.cpp)
mgpu_test(test_resnet_layers DEVICE LIBS mgpu_resnet)  # each layer against plain loops and finite differences
endif()
mgpu_test(test_resnet DEVICE LIBS mgpu_resnet)         # the network: gradients, SyncBN, evaluation mode
mgpu_chaos_tests(test_resnet)  # the SyncBN allreduces between layers, under random delays
