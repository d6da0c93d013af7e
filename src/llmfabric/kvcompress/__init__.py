"""4-bit (2/3/4/8-bit) KV-cache compression for the prefill -> decode hand-off
(ThunderServe §4 / App. I; COMPANIONS.md §1.5): KIVI-style asymmetric min-max quantization.

Files:
- `quantize.py`  quantize_keys / quantize_values / dequantize and the `QuantizedKV` record:
  keys per channel (groups of G consecutive tokens, the n mod G token tail kept in fp16),
  values per token (groups of G channels); fp16 scale and minimum per group.
- `pack.py`      pack / unpack of b-bit codes into bytes (little-endian bit order: two 4-bit
  codes per byte, low nibble first).
- `accounting.py` exact wire bytes (codes + scales/minimums + fp16 tail) of one tensor and of
  a model's whole KV cache; the simulator's per-element figure is checked against it.
"""

from llmfabric.kvcompress.accounting import (
    BITS,
    bytes_per_element,
    key_bytes,
    model_kv_bytes,
    value_bytes,
)
from llmfabric.kvcompress.pack import pack, unpack
from llmfabric.kvcompress.quantize import QuantizedKV, dequantize, quantize_keys, quantize_values

__all__ = ["BITS", "QuantizedKV", "bytes_per_element", "dequantize", "key_bytes",
           "model_kv_bytes", "pack", "quantize_keys", "quantize_values", "unpack",
           "value_bytes"]
