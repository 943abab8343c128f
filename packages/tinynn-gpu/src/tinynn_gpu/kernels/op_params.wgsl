// Prepended by the loader to every kernel file of ops/, after common.wgsl: each declares its own `struct Params` of
// named fields (params.py packs it), bound here.
@group(0) @binding(3) var<uniform> params: Params;
