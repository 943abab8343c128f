// Where one (batch, head) of the attention kernels starts, in vec4s: its q in qkv (B, T, 3C), its row in y and
// g (B, T, C). attention.py fills it into attention.wgsl and attention_tiled.wgsl (both declare HS4 and Params).
struct Head { bh: u32, qkv: u32, yg: u32 }

fn head(bh: u32) -> Head {
    let nh = params.n_head;
    let b = bh / nh;
    let h = bh % nh;
    return Head(bh, b * params.seq * 3u * nh * HS4 + h * HS4, b * params.seq * nh * HS4 + h * HS4);
}
