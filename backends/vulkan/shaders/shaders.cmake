# Every SPIR-V variant built from shaders/*.comp (included by ../CMakeLists.txt).
foreach(e 1 2 4 8)
  kiln_vk_shader(strided_copy_e${e} strided_copy.comp ELEM_BYTES=${e})
  kiln_vk_shader(gather_e${e} gather.comp ELEM_BYTES=${e})
endforeach()

# Reductions, softmax and norms: per dtype, with and without subgroup ops
# (the _sg variants need subgroup basic + shuffle in compute shaders).
foreach(sg "" "_sg")
  set(sgdef "")
  if(sg)
    set(sgdef USE_SUBGROUPS)
  endif()
  foreach(dt f32 f16 bf16)
    string(TOUPPER ${dt} DT)
    kiln_vk_shader(softmax_${dt}${sg} softmax.comp DT_${DT} ${sgdef})
    kiln_vk_shader(norm_${dt}${sg} norm.comp DT_${DT} ${sgdef})
    kiln_vk_shader(group_norm_${dt}${sg} group_norm.comp DT_${DT} ${sgdef})
  endforeach()
  foreach(dt f32 f16 bf16 i8 u8 i16 i32)
    string(TOUPPER ${dt} DT)
    kiln_vk_shader(reduce_${dt}${sg} reduce.comp DT_${DT} ${sgdef})
  endforeach()
endforeach()
# i64 reductions use the shared-memory tree only (subgroup shuffles of 64-bit
# integers would need shaderSubgroupExtendedTypes).
kiln_vk_shader(reduce_i64 reduce.comp DT_I64)

# Matrix products: the tiled kernel per storage dtype; the cooperative-matrix
# kernel (VK_NV_cooperative_matrix, f16) is selected only on devices that
# report it, and its emulation (no cooperative matrices) only by
# KILN_VULKAN_COOP_EMULATE, for testing its tiling on lavapipe.
foreach(dt f32 f16 bf16)
  string(TOUPPER ${dt} DT)
  kiln_vk_shader(matmul_${dt} matmul.comp DT_${DT})
endforeach()
kiln_vk_shader(matmul_coop_nv_f16 matmul_coop_nv.comp)
kiln_vk_shader(matmul_coop_emu_f16 matmul_coop_nv.comp COOP_EMULATE)

foreach(dt f32 f16 bf16)
  string(TOUPPER ${dt} DT)
  kiln_vk_shader(attention_${dt} attention.comp DT_${DT})
endforeach()
foreach(dt f32 f16 bf16)
  string(TOUPPER ${dt} DT)
  kiln_vk_shader(matvec_${dt} matvec.comp DT_${DT})
endforeach()

# DequantMatMul (block-quantized weights; the block type is a specialization
# constant): per activation dtype, the matvec and the tiled kernel.
foreach(dt f32 f16 bf16)
  string(TOUPPER ${dt} DT)
  kiln_vk_shader(dequant_matvec_${dt} dequant_matvec.comp DT_${DT})
  kiln_vk_shader(dequant_matmul_${dt} dequant_matmul.comp DT_${DT})
endforeach()

# TopK: the key type of the stored values.
foreach(dt f32 f16 bf16 i32)
  string(TOUPPER ${dt} DT)
  kiln_vk_shader(topk_${dt} topk.comp KEY_${DT})
endforeach()
