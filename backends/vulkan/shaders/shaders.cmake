# Every SPIR-V variant built from shaders/*.comp (included by ../CMakeLists.txt).
foreach(e 1 2 4 8)
  kiln_vk_shader(strided_copy_e${e} strided_copy.comp ELEM_BYTES=${e})
  kiln_vk_shader(gather_e${e} gather.comp ELEM_BYTES=${e})
endforeach()
