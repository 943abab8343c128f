// What every attention kernel shares, filled into each (attention.wgsl, the tiled and the tensor-core forwards
// and backwards; each declares HS4, and its own bindings past these): the parameters, the arrays
// in the qkv layout, and where one (batch, head) starts in them, in vec4s: its q in qkv (B, T, 3C), its row in y
// and g (B, T, C). lse is written by the forwards and read by the backwards.
struct Params { seq: u32, n_head: u32, scale: f32 }

@group(0) @binding(0) var<storage, read> qkv: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> g: array<vec4<f32>>;  // the gradient of y
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> lse: array<f32>;
@group(0) @binding(5) var<storage, read> y: array<vec4<f32>>;

struct Head { bh: u32, qkv: u32, yg: u32 }

fn head(bh: u32) -> Head {
    let nh = params.n_head;
    let b = bh / nh;
    let h = bh % nh;
    return Head(bh, b * params.seq * 3u * nh * HS4 + h * HS4, b * params.seq * nh * HS4 + h * HS4);
}
