"""Stand-in for aiter.dtypes: the names of the dtypes the stand-in's tensors carry."""

from ._standin import platform_fp8

fp8 = platform_fp8()
bf16 = "bf16"
fp16 = "f16"
fp32 = "f32"
i32 = "i32"
i64 = "i64"
u8 = "u8"
