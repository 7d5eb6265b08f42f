//! Official checkpoint names and GGUF names, one table read both ways: [`gguf_name`] renames
//! an official state-dict key (without the `model.` prefix) as files name it,
//! [`official_name`] a GGUF name back.
//!
//! The GGUF names are depth-anything.cpp's. The camera encoder (`cam_enc.*`, which
//! depth-anything.cpp does not convert) is kept under `cam_enc.`: `pose.fc1` / `pose.fc2` (the
//! official `pose_branch`), `token_norm`, `blk.{i}.*` (the official `trunk.{i}`, fields named
//! as in the backbone blocks) and `trunk_norm`. The DualDPT ray branch (`*_aux`) is named as
//! depth-anything.cpp's `--with-aux` files name it, so that their files and ours load alike:
//! the fusion chain `head.scratch.rn{k}_aux.*`, and of the per-level output convolutions only
//! the last (finest) level, the one the official forward returns: `head.scratch.out1_aux.{i}`
//! (`output_conv1_aux.3.{i}`), `out2a_aux` / `out2b_aux` (`output_conv2_aux.3.0` / `.3.5`) and
//! `out2_aux_ln` (the LayerNorm every level shares). The other levels get names no graph
//! declares, so a conversion leaves them out; so does any key outside the parts below (the
//! 3DGS head, `gs_*`).

use crate::da3::config::Family;

/// One part of the model: its official prefix, its GGUF prefix, and renamings of name
/// fragments after the prefix as (official, GGUF), applied in this order in either direction.
struct Part {
    official: &'static str,
    gguf: &'static str,
    /// Tables of renamings, applied one after another.
    renames: &'static [&'static [(&'static str, &'static str)]],
    /// Whether the part holds transformer blocks, whose fields [`BLOCK_FIELDS`] renames.
    blocks: bool,
}

/// A transformer block's fields (`attn.qkv.weight` is `attn_qkv.weight`).
const BLOCK_FIELDS: &[(&str, &str)] = &[
    ("attn.qkv", "attn_qkv"),
    ("attn.proj", "attn_proj"),
    ("attn.q_norm", "attn_qnorm"),
    ("attn.k_norm", "attn_knorm"),
    ("ls1.gamma", "ls1"),
    ("ls2.gamma", "ls2"),
    ("mlp.fc1", "mlp_fc1"),
    ("mlp.fc2", "mlp_fc2"),
    ("mlp.w12", "mlp_w12"),
    ("mlp.w3", "mlp_w3"),
];

/// The DPT / DualDPT head's names after its prefix.
const HEAD_RENAMES: &[(&str, &str)] = &[
    ("projects.", "proj."),
    ("resize_layers.", "resize."),
    ("scratch.output_conv1.", "scratch.out1."),
    ("scratch.output_conv2.0.", "scratch.out2a."),
    ("scratch.output_conv2.2.", "scratch.out2b."),
    ("scratch.sky_output_conv2.0.", "scratch.sky_out2a."),
    ("scratch.sky_output_conv2.2.", "scratch.sky_out2b."),
    ("scratch.output_conv1_aux.3.", "scratch.out1_aux."),
    ("scratch.output_conv2_aux.3.0.", "scratch.out2a_aux."),
    ("scratch.output_conv2_aux.3.5.", "scratch.out2b_aux."),
    // One LayerNorm module serves every level (`ln_seq` is built once): one tensor,
    // level 0's backwards (the first of these to match).
    ("scratch.output_conv2_aux.0.2.", "scratch.out2_aux_ln."),
    ("scratch.output_conv2_aux.1.2.", "scratch.out2_aux_ln."),
    ("scratch.output_conv2_aux.2.2.", "scratch.out2_aux_ln."),
    ("scratch.output_conv2_aux.3.2.", "scratch.out2_aux_ln."),
    // The coarser levels, which the official forward computes and drops.
    ("scratch.output_conv1_aux.", "scratch.out1_aux_unused."),
    ("scratch.output_conv2_aux.", "scratch.out2_aux_unused."),
    ("refinenet1.", "rn1."),
    ("refinenet2.", "rn2."),
    ("refinenet3.", "rn3."),
    ("refinenet4.", "rn4."),
    ("refinenet1_aux.", "rn1_aux."),
    ("refinenet2_aux.", "rn2_aux."),
    ("refinenet3_aux.", "rn3_aux."),
    ("refinenet4_aux.", "rn4_aux."),
    (".resConfUnit", ".rc"),
    (".conv1.", ".c1."),
    (".conv2.", ".c2."),
    (".out_conv.", ".out."),
];

/// The Gaussian head's image merger (`Sequential(Conv, GELU, Conv, GELU, Conv, GELU)`), before
/// the head's names: the highest index first, so that no renamed name matches again going
/// back.
const MERGER_RENAMES: &[(&str, &str)] = &[
    ("images_merger.4.", "merger.2."),
    ("images_merger.2.", "merger.1."),
    ("images_merger.0.", "merger.0."),
];

/// The DINOv2 backbone's names after its prefix.
const BACKBONE_RENAMES: &[(&str, &str)] =
    &[("patch_embed.proj.", "patch_embed."), ("blocks.", "blk.")];

const PARTS: &[Part] = &[
    Part {
        official: "backbone.pretrained.",
        gguf: "vit.",
        renames: &[BACKBONE_RENAMES],
        blocks: true,
    },
    Part {
        official: "cam_enc.",
        gguf: "cam_enc.",
        renames: &[&[("trunk.", "blk."), ("pose_branch.", "pose.")]],
        blocks: true,
    },
    Part {
        official: "head.",
        gguf: "head.",
        renames: &[HEAD_RENAMES],
        blocks: false,
    },
    Part {
        official: "cam_dec.",
        gguf: "cam.",
        renames: &[&[
            ("backbone.0.", "bb0."),
            ("backbone.2.", "bb2."),
            ("fc_qvec.", "fc_q."),
            ("fc_fov.0.", "fc_fov."),
        ]],
        blocks: false,
    },
    Part {
        official: "gs_head.",
        gguf: "gs.",
        renames: &[MERGER_RENAMES, HEAD_RENAMES],
        blocks: false,
    },
];

/// Depth Anything V2's checkpoints (`depth_anything_v2_vits.pth`, ...): the backbone under
/// `pretrained.`, the DPT head under `depth_head.`, named inside as DA3's are.
const DA2_PARTS: &[Part] = &[
    Part {
        official: "pretrained.",
        gguf: "vit.",
        renames: &[BACKBONE_RENAMES],
        blocks: true,
    },
    Part {
        official: "depth_head.",
        gguf: "head.",
        renames: &[HEAD_RENAMES],
        blocks: false,
    },
];

/// The parts of a family's checkpoints.
fn parts(family: Family) -> &'static [Part] {
    match family {
        Family::Da3 => PARTS,
        Family::Da2 { .. } => DA2_PARTS,
    }
}

/// `name` renamed official to GGUF (`to_gguf`) or back; None outside every part.
fn rename(family: Family, name: &str, to_gguf: bool) -> Option<String> {
    let side = |pair: (&'static str, &'static str)| match to_gguf {
        true => pair,
        false => (pair.1, pair.0),
    };
    parts(family).iter().find_map(|part| {
        let (from, to) = side((part.official, part.gguf));
        let rest = name.strip_prefix(from)?;
        let fields: &[(&str, &str)] = if part.blocks { BLOCK_FIELDS } else { &[] };
        let rest = part
            .renames
            .iter()
            .flat_map(|table| table.iter())
            .chain(fields)
            .fold(rest.to_owned(), |rest, &pair| {
                let (a, b) = side(pair);
                rest.replace(a, b)
            });
        Some(format!("{to}{rest}"))
    })
}

/// The GGUF name of an official state-dict key (without the `model.` prefix), or `None` for
/// tensors of no part the files hold.
pub fn gguf_name(key: &str) -> Option<String> {
    rename(Family::Da3, key, true)
}

/// The official key of a GGUF name (the inverse of [`gguf_name`] on the tensors the
/// architecture declares); a name of no part comes back as it is.
pub fn official_name(gguf: &str) -> String {
    official_name_in(Family::Da3, gguf)
}

/// [`official_name`] in the checkpoints of `family` (DA2's `pretrained.*` / `depth_head.*`).
pub fn official_name_in(family: Family, gguf: &str) -> String {
    rename(family, gguf, false).unwrap_or_else(|| gguf.to_owned())
}

/// [`gguf_name`] of a key of `family`'s checkpoints.
pub fn gguf_name_in(family: Family, key: &str) -> Option<String> {
    rename(family, key, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::da3::architecture::{tensors, Parts};
    use crate::da3::{Config, PRESETS};

    /// Every tensor of every preset goes to its official name and back.
    #[test]
    fn every_declared_name_round_trips() {
        for preset in PRESETS {
            let config = Config::preset(preset).unwrap();
            for t in tensors(&config, &Parts::of_config(&config)).unwrap() {
                // As the converter maps it: a name of no part is its own GGUF name.
                let official = official_name_in(config.family, &t.name);
                let back =
                    gguf_name_in(config.family, &official).unwrap_or_else(|| official.clone());
                assert_eq!(back, t.name);
            }
        }
    }

    #[test]
    fn names_follow_the_official_layout() {
        for (official, gguf) in [
            (
                "backbone.pretrained.patch_embed.proj.weight",
                "vit.patch_embed.weight",
            ),
            ("backbone.pretrained.blocks.3.ls1.gamma", "vit.blk.3.ls1"),
            (
                "cam_enc.trunk.0.attn.qkv.bias",
                "cam_enc.blk.0.attn_qkv.bias",
            ),
            ("cam_enc.pose_branch.fc1.weight", "cam_enc.pose.fc1.weight"),
            (
                "head.scratch.refinenet1_aux.resConfUnit1.conv1.weight",
                "head.scratch.rn1_aux.rc1.c1.weight",
            ),
            ("cam_dec.fc_fov.0.bias", "cam.fc_fov.bias"),
            // The 3D Gaussian head, as depth-anything.cpp's `rename_gs` names it.
            ("gs_head.images_merger.2.weight", "gs.merger.1.weight"),
            ("gs_head.images_merger.4.bias", "gs.merger.2.bias"),
            ("gs_head.projects.3.weight", "gs.proj.3.weight"),
            (
                "gs_head.scratch.refinenet2.resConfUnit1.conv2.bias",
                "gs.scratch.rn2.rc1.c2.bias",
            ),
            (
                "gs_head.scratch.output_conv2.2.weight",
                "gs.scratch.out2b.weight",
            ),
        ] {
            assert_eq!(gguf_name(official).as_deref(), Some(gguf));
            assert_eq!(official_name(gguf), official);
        }
        // Every level's LayerNorm is the one tensor; coarser levels are no tensor of a file.
        let ln = "head.scratch.out2_aux_ln.weight";
        assert_eq!(
            gguf_name("head.scratch.output_conv2_aux.2.2.weight").as_deref(),
            Some(ln)
        );
        assert_eq!(
            official_name(ln),
            "head.scratch.output_conv2_aux.0.2.weight"
        );
        assert_eq!(
            gguf_name("head.scratch.output_conv1_aux.0.0.weight").as_deref(),
            Some("head.scratch.out1_aux_unused.0.0.weight")
        );
        assert_eq!(gguf_name("gs_adapter.sh_mask"), None);
        // Depth Anything V2's checkpoints, as its `DepthAnythingV2` module names them.
        let da2 = Config::preset("da2-small").unwrap().family;
        for (official, gguf) in [
            (
                "pretrained.blocks.11.mlp.fc2.bias",
                "vit.blk.11.mlp_fc2.bias",
            ),
            (
                "pretrained.patch_embed.proj.weight",
                "vit.patch_embed.weight",
            ),
            (
                "depth_head.scratch.refinenet4.resConfUnit2.conv1.weight",
                "head.scratch.rn4.rc2.c1.weight",
            ),
            (
                "depth_head.scratch.output_conv2.2.bias",
                "head.scratch.out2b.bias",
            ),
            ("depth_head.resize_layers.3.weight", "head.resize.3.weight"),
        ] {
            assert_eq!(gguf_name_in(da2, official).as_deref(), Some(gguf));
            assert_eq!(official_name_in(da2, gguf), official);
        }
        assert_eq!(
            gguf_name_in(da2, "pretrained.mask_token"),
            Some("vit.mask_token".into())
        );
    }
}
