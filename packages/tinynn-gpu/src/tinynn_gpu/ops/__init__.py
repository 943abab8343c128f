"""The ops wing: each launcher beside its kernel file of the same name (layernorm.py launches layernorm.wgsl's
entry points), its functions methods of the backend under the NumPy reference's names (backend.py's table)."""
