//! A projector (mmproj GGUF) checked before llama.cpp's clip loader reads it.
//!
//! The loader trusts its file. A key of another type than its getter asks for, a head count that
//! does not divide the width, a NaN epsilon or a position table shorter than an image's patches
//! abort the process (GGML_ASSERT); a tensor it loads as optional but uses, or another projector
//! type's tensors, make it read through a null pointer at load or at the first image. So the
//! keys, hyperparameters and tensor shapes are checked here against what the graph of the file's
//! projector type reads, and types whose graphs are not checked are refused
//! [llama.cpp internal: tools/mtmd/clip.cpp, its graphs in tools/mtmd/models/].

use std::collections::HashMap;
use std::path::Path;

use crate::errors::{Error, ExcClass, Result};
use crate::metadata::{
    self, KeptValue, GGUF_TYPE_BOOL, GGUF_TYPE_FLOAT32, GGUF_TYPE_INT32, GGUF_TYPE_STRING, GGUF_TYPE_UINT32,
};

/// The vision projector types whose graphs are checked here (`clip.projector_type`).
pub const VISION_TYPES: [&str; 6] = [
    "mlp",
    "idefics3",
    "gemma3",
    "qwen2vl_merger",
    "qwen2.5vl_merger",
    "qwen2.5o",
];
/// The audio projector types checked here.
pub const AUDIO_TYPES: [&str; 1] = ["ultravox"];

/// The keys clip reads with a scalar getter, and the GGUF type it asks for: a value of another
/// type, or an array, fails an assertion in gguf.cpp. `{t}` is each tower, vision and audio.
const TOWER_KEYS: [(&str, u32); 8] = [
    ("embedding_length", GGUF_TYPE_UINT32),
    ("attention.head_count", GGUF_TYPE_UINT32),
    ("feed_forward_length", GGUF_TYPE_UINT32),
    ("block_count", GGUF_TYPE_UINT32),
    ("projection_dim", GGUF_TYPE_UINT32),
    ("attention.head_dim", GGUF_TYPE_UINT32),
    ("attention.head_count_kv", GGUF_TYPE_UINT32),
    ("attention.layer_norm_epsilon", GGUF_TYPE_FLOAT32),
];
const OTHER_KEYS: [(&str, u32); 24] = [
    ("general.name", GGUF_TYPE_STRING),
    ("general.description", GGUF_TYPE_STRING),
    ("clip.has_vision_encoder", GGUF_TYPE_BOOL),
    ("clip.has_audio_encoder", GGUF_TYPE_BOOL),
    ("clip.has_gen_audio_encoder", GGUF_TYPE_BOOL),
    ("clip.use_gelu", GGUF_TYPE_BOOL),
    ("clip.use_silu", GGUF_TYPE_BOOL),
    ("clip.projector_type", GGUF_TYPE_STRING),
    ("clip.vision.projector_type", GGUF_TYPE_STRING),
    ("clip.audio.projector_type", GGUF_TYPE_STRING),
    ("clip.gen.audio.projector_type", GGUF_TYPE_STRING),
    ("clip.vision.mm_patch_merge_type", GGUF_TYPE_STRING),
    ("clip.vision.image_size", GGUF_TYPE_UINT32),
    ("clip.vision.patch_size", GGUF_TYPE_UINT32),
    ("clip.vision.max_slice_nums", GGUF_TYPE_UINT32),
    ("clip.minicpmv_version", GGUF_TYPE_INT32),
    ("clip.minicpmv_query_num", GGUF_TYPE_UINT32),
    ("clip.audio.num_mel_bins", GGUF_TYPE_UINT32),
    ("clip.vision.projector.scale_factor", GGUF_TYPE_UINT32),
    ("clip.vision.preproc_image_size", GGUF_TYPE_UINT32),
    ("clip.vision.spatial_merge_size", GGUF_TYPE_UINT32),
    ("clip.vision.n_wa_pattern", GGUF_TYPE_UINT32),
    ("clip.vision.image_min_pixels", GGUF_TYPE_UINT32),
    ("clip.vision.image_max_pixels", GGUF_TYPE_UINT32),
];
/// `clip.audio.projector.stack_factor`, Ultravox's.
const STACK_FACTOR_KEY: &str = "clip.audio.projector.stack_factor";

/// The largest image side clip accepts, and what bounds its merge factors.
const MAX_IMAGE_SIZE: u64 = 8192;
const MAX_MERGE: u64 = 16;
/// Encoder positions of one 30-second audio chunk (3000 mel frames halved by the stride-2
/// convolution), and the mel bins clip accepts.
const AUDIO_POSITIONS: u64 = 1500;
const MAX_MEL_BINS: u64 = 256;

fn invalid(message: String) -> Error {
    Error::llama(
        ExcClass::MtmdError,
        "InvalidProjector",
        None,
        format!("{message}; llama.cpp's projector loader cannot read it safely"),
    )
}

/// Checks the projector at `path` for a text model whose embeddings are `text_width` wide.
/// `MtmdError` kind `InvalidProjector` for a file whose keys, hyperparameters or tensors do not
/// fit its projector type, `UnsupportedProjector` for a type not checked here. A file that is not
/// readable GGUF passes: llama.cpp refuses it with an error of its own.
pub fn check_projector_file(path: &Path, text_width: u64) -> Result<()> {
    let header = match metadata::read_projector_header(path) {
        Ok(Some(header)) => header,
        Ok(None) => return Ok(()),
        Err(count) => {
            return Err(invalid(format!(
                "the file lists {count} tensors, more than any projector has"
            )))
        }
    };
    let file = ProjectorFile {
        keys: &header.kept,
        shapes: &header.shapes,
    };
    file.check_key_types()?;
    if file.flag("clip.has_gen_audio_encoder") {
        return Err(unsupported("an audio generation encoder"));
    }
    let vision = file.flag("clip.has_vision_encoder");
    let audio = file.flag("clip.has_audio_encoder");
    if !vision && !audio {
        return Err(Error::llama(
            ExcClass::MtmdError,
            "InvalidProjector",
            None,
            "the file is no projector: it has neither a vision nor an audio encoder \
             (clip.has_vision_encoder, clip.has_audio_encoder)",
        ));
    }
    if vision {
        let kind = file.projector_type("vision");
        if !VISION_TYPES.contains(&kind) {
            return Err(unsupported(&format!("the vision projector type {kind:?}")));
        }
        let tower = file.tower("vision", "v")?;
        file.check_vision(kind, &tower, text_width)?;
    }
    if audio {
        let kind = file.projector_type("audio");
        if !AUDIO_TYPES.contains(&kind) {
            return Err(unsupported(&format!("the audio projector type {kind:?}")));
        }
        let tower = file.tower("audio", "a")?;
        file.check_ultravox(&tower, text_width)?;
    }
    Ok(())
}

fn unsupported(what: &str) -> Error {
    Error::llama(
        ExcClass::MtmdError,
        "UnsupportedProjector",
        None,
        format!(
            "{what} is not one whose files llamactx checks before llama.cpp loads them (vision: {}; audio: {})",
            VISION_TYPES.join(", "),
            AUDIO_TYPES.join(", ")
        ),
    )
}

/// An encoder's hyperparameters (`clip.{vision,audio}.*`) and its tensors' prefix.
struct Tower {
    prefix: &'static str,
    width: u64,
    heads: u64,
    layers: u64,
}

struct ProjectorFile<'a> {
    keys: &'a HashMap<String, KeptValue>,
    shapes: &'a HashMap<String, Vec<u64>>,
}

impl ProjectorFile<'_> {
    fn check_key_types(&self) -> Result<()> {
        let tower_keys = ["vision", "audio"].into_iter().flat_map(|tower| {
            TOWER_KEYS
                .iter()
                .map(move |(key, gguf_type)| (format!("clip.{tower}.{key}"), *gguf_type))
        });
        let other_keys = OTHER_KEYS
            .iter()
            .map(|(key, gguf_type)| ((*key).to_owned(), *gguf_type));
        let stack = std::iter::once((STACK_FACTOR_KEY.to_owned(), GGUF_TYPE_UINT32));
        for (key, expected) in tower_keys.chain(other_keys).chain(stack) {
            if let Some(found) = self.keys.get(&key).map(KeptValue::gguf_type) {
                if found != expected {
                    return Err(invalid(format!(
                        "its key {key} has GGUF type {found}, where llama.cpp reads type {expected}"
                    )));
                }
            }
        }
        Ok(())
    }

    fn flag(&self, key: &str) -> bool {
        matches!(self.keys.get(key), Some(KeptValue::Scalar { bits, .. }) if *bits & 0xff != 0)
    }

    fn text(&self, key: &str) -> &str {
        match self.keys.get(key) {
            Some(KeptValue::Text(text)) => text,
            _ => "",
        }
    }

    /// The projector type of `tower`, as clip finds it: the shared key, else the tower's own.
    fn projector_type(&self, tower: &str) -> &str {
        let shared = self.text("clip.projector_type");
        if shared.is_empty() {
            self.text(&format!("clip.{tower}.projector_type"))
        } else {
            shared
        }
    }

    /// A `u32` key (its type is checked), None where the file has none.
    fn number(&self, key: &str) -> Option<u64> {
        match self.keys.get(key) {
            Some(KeptValue::Scalar { bits, .. }) => Some(*bits & 0xffff_ffff),
            _ => None,
        }
    }

    fn required(&self, key: &str) -> Result<u64> {
        self.number(key)
            .ok_or_else(|| invalid(format!("it lacks the key {key}")))
    }

    fn tower(&self, name: &str, prefix: &'static str) -> Result<Tower> {
        let key = |suffix: &str| format!("clip.{name}.{suffix}");
        let width = self.required(&key("embedding_length"))?;
        let heads = self.required(&key("attention.head_count"))?;
        let layers = self.required(&key("block_count"))?;
        self.required(&key("feed_forward_length"))?;
        self.required(&key("projection_dim"))?;
        if width == 0 || heads == 0 || !width.is_multiple_of(heads) {
            return Err(invalid(format!(
                "its {name} encoder has {heads} attention heads, which do not divide its width {width}"
            )));
        }
        if let Some(head_dim) = self
            .number(&key("attention.head_dim"))
            .filter(|dim| *dim != width / heads)
        {
            return Err(invalid(format!(
                "its {name} encoder's head dimension {head_dim} is not its width {width} over {heads} heads"
            )));
        }
        if let Some(kv) = self.number(&key("attention.head_count_kv")).filter(|kv| *kv != heads) {
            return Err(invalid(format!(
                "its {name} encoder has {kv} key-value heads and {heads} query heads; the graphs need as many"
            )));
        }
        let epsilon = match self.keys.get(&key("attention.layer_norm_epsilon")) {
            Some(KeptValue::Scalar { bits, .. }) => f32::from_bits(u32::try_from(*bits & 0xffff_ffff).unwrap_or(0)),
            _ => {
                return Err(invalid(format!(
                    "it lacks the key {}",
                    key("attention.layer_norm_epsilon")
                )))
            }
        };
        if !(epsilon.is_finite() && (0.0..1.0).contains(&epsilon)) {
            return Err(invalid(format!(
                "its {name} encoder's layer norm epsilon is {epsilon}, not a finite number from 0 to 1"
            )));
        }
        // Each block has an output projection: the count cannot pass the tensors the file has.
        if layers == 0 || layers > self.shapes.len() as u64 {
            return Err(invalid(format!(
                "its {name} encoder has {layers} blocks, for {} tensors",
                self.shapes.len()
            )));
        }
        Ok(Tower {
            prefix,
            width,
            heads,
            layers,
        })
    }

    /// The dimensions of tensor `name` (ggml's `ne`, innermost first), without trailing ones.
    fn dims(&self, name: &str) -> Option<Vec<u64>> {
        self.shapes.get(name).map(|dims| {
            let mut dims = dims.clone();
            while dims.len() > 1 && dims.last() == Some(&1) {
                dims.pop();
            }
            dims
        })
    }

    fn require(&self, name: &str, expected: &[u64]) -> Result<()> {
        match self.dims(name) {
            None => Err(invalid(format!("it lacks the tensor {name}"))),
            Some(found) => same(name, &found, expected),
        }
    }

    fn optional(&self, name: &str, expected: &[u64]) -> Result<()> {
        self.dims(name).map_or(Ok(()), |found| same(name, &found, expected))
    }

    fn forbid(&self, name: &str, why: &str) -> Result<()> {
        if self.shapes.contains_key(name) {
            return Err(invalid(format!("it has the tensor {name}, {why}")));
        }
        Ok(())
    }

    /// Dimension `axis` of tensor `name`, which must exist and be 1 or 2 dimensional.
    fn width_of(&self, name: &str, axis: usize) -> Result<u64> {
        let dims = self
            .dims(name)
            .ok_or_else(|| invalid(format!("it lacks the tensor {name}")))?;
        match dims.get(axis) {
            Some(width) if dims.len() <= 2 && *width > 0 => Ok(*width),
            _ => Err(invalid(format!("its tensor {name} has dimensions {dims:?}"))),
        }
    }

    /// The transformer blocks every type shares. `fused` allows a fused q, k and v projection
    /// (the SigLIP graphs read one); `biases` requires the q, k and v biases (Qwen's graph adds
    /// them unchecked).
    fn check_blocks(&self, tower: &Tower, fused: bool, biases: bool) -> Result<()> {
        let width = tower.width;
        for layer in 0..tower.layers {
            let name = |suffix: &str| format!("{}.blk.{layer}.{suffix}", tower.prefix);
            if fused && self.shapes.contains_key(&name("attn_qkv.weight")) {
                self.require(&name("attn_qkv.weight"), &[width, 3 * width])?;
                self.optional(&name("attn_qkv.bias"), &[3 * width])?;
            } else {
                for projection in ["attn_q", "attn_k", "attn_v"] {
                    self.require(&name(&format!("{projection}.weight")), &[width, width])?;
                    let bias = name(&format!("{projection}.bias"));
                    if biases {
                        self.require(&bias, &[width])?;
                    } else {
                        self.optional(&bias, &[width])?;
                    }
                }
            }
            self.require(&name("attn_out.weight"), &[width, width])?;
            self.optional(&name("attn_out.bias"), &[width])?;
            for norm in ["ln1", "ln2", "attn_q_norm", "attn_k_norm"] {
                self.optional(&name(&format!("{norm}.weight")), &[width])?;
                self.optional(&name(&format!("{norm}.bias")), &[width])?;
            }
            self.check_feed_forward(&name, width)?;
            self.forbid(
                &name("ffn_gate_exps.weight"),
                "a mixture of experts no checked graph reads",
            )?;
        }
        Ok(())
    }

    /// Up and down projections of one width, either way round (the loader swaps them when the
    /// down projection's input is the width), a gate as the up projection.
    fn check_feed_forward(&self, name: &dyn Fn(&str) -> String, width: u64) -> Result<()> {
        let (up, down) = (name("ffn_up.weight"), name("ffn_down.weight"));
        let hidden = self.width_of(&up, 1)?;
        let (up_dims, down_dims) = (self.dims(&up), self.dims(&down));
        let straight =
            up_dims.as_deref() == Some(&[width, hidden][..]) && down_dims.as_deref() == Some(&[hidden, width][..]);
        let hidden_in = self.width_of(&up, 0)?;
        let swapped = up_dims.as_deref() == Some(&[hidden_in, width][..])
            && down_dims.as_deref() == Some(&[width, hidden_in][..]);
        if !straight && !swapped {
            return Err(invalid(format!(
                "its feed-forward tensors {up} {up_dims:?} and {down} {down_dims:?} do not fit the width {width}"
            )));
        }
        let hidden = if straight { hidden } else { hidden_in };
        self.optional(&name("ffn_gate.weight"), &[width, hidden])?;
        let (up_out, down_out) = if straight { (hidden, width) } else { (width, hidden) };
        self.optional(&name("ffn_up.bias"), &[up_out])?;
        self.optional(&name("ffn_down.bias"), &[down_out])?;
        self.optional(&name("ffn_gate.bias"), &[hidden])
    }

    fn check_vision(&self, kind: &str, tower: &Tower, text_width: u64) -> Result<()> {
        let image = self.required("clip.vision.image_size")?;
        let patch = self.required("clip.vision.patch_size")?;
        if patch == 0 || image > MAX_IMAGE_SIZE || patch > image || !image.is_multiple_of(patch) {
            return Err(invalid(format!(
                "its images of {image} pixels are not a whole number of {patch}-pixel patches (at most {MAX_IMAGE_SIZE})"
            )));
        }
        let side = image / patch;
        let width = tower.width;
        self.require("v.patch_embd.weight", &[patch, patch, 3, width])?;
        match kind {
            "mlp" => {
                self.optional("v.patch_embd.bias", &[width])?;
                self.optional("v.class_embd", &[width])?;
                let positions = side * side + u64::from(self.shapes.contains_key("v.class_embd"));
                self.check_position_rows("v.position_embd.weight", width, positions, false)?;
                self.check_blocks(tower, false, false)?;
                self.forbid("mm.3.weight", "the normed projection (mlp_norm), which is not checked")?;
                // Feature layers stack several blocks' outputs: the projection reads a multiple
                // of the width.
                let input = self.width_of("mm.0.weight", 0)?;
                if !input.is_multiple_of(width) {
                    return Err(invalid(format!(
                        "its projection reads {input} values, not a multiple of the width {width}"
                    )));
                }
                self.check_mlp_head("mm.0", "mm.2", input, text_width)
            }
            "idefics3" | "gemma3" => {
                let merge = self
                    .number("clip.vision.projector.scale_factor")
                    .unwrap_or(if kind == "gemma3" { 4 } else { 1 });
                let least = if kind == "idefics3" { 2 } else { 1 };
                if !(least..=MAX_MERGE).contains(&merge) || !side.is_multiple_of(merge) {
                    return Err(invalid(format!(
                        "its scale factor {merge} does not divide its {side} patches a side (from {least} to {MAX_MERGE})"
                    )));
                }
                if self.shapes.contains_key("v.position_embd.weight") {
                    self.check_position_rows("v.position_embd.weight", width, side * side, true)?;
                }
                self.check_blocks(tower, true, false)?;
                if kind == "idefics3" {
                    self.require("mm.model.fc.weight", &[width * merge * merge, text_width])
                } else {
                    self.require("mm.soft_emb_norm.weight", &[width])?;
                    self.require("mm.input_projection.weight", &[text_width, width])
                }
            }
            _ => self.check_qwen(kind, tower, patch, text_width),
        }
    }

    fn check_position_rows(&self, name: &str, width: u64, positions: u64, exact: bool) -> Result<()> {
        let rows = match self.dims(name).as_deref() {
            Some([found, rows]) if *found == width => *rows,
            Some([found]) if *found == width => 1,
            None => return Err(invalid(format!("it lacks the tensor {name}"))),
            Some(dims) => {
                return Err(invalid(format!(
                    "its tensor {name} has dimensions {dims:?}, not [{width}, rows]"
                )))
            }
        };
        if rows < positions || (exact && rows != positions) {
            return Err(invalid(format!(
                "its position table {name} has {rows} rows, for {positions} positions an input takes"
            )));
        }
        Ok(())
    }

    /// A two-layer projection `first` then `second` (weights and biases), from `input` values to
    /// the text model's width.
    fn check_mlp_head(&self, first: &str, second: &str, input: u64, text_width: u64) -> Result<()> {
        let hidden = self.width_of(&format!("{first}.weight"), 1)?;
        self.require(&format!("{first}.weight"), &[input, hidden])?;
        self.require(&format!("{first}.bias"), &[hidden])?;
        self.require(&format!("{second}.weight"), &[hidden, text_width])?;
        self.require(&format!("{second}.bias"), &[text_width])
    }

    fn check_qwen(&self, kind: &str, tower: &Tower, patch: u64, text_width: u64) -> Result<()> {
        let width = tower.width;
        self.require("v.patch_embd.weight.1", &[patch, patch, 3, width])?;
        self.forbid("v.patch_embd.bias", "which Qwen's graph refuses")?;
        self.forbid("v.class_embd", "which Qwen's graph refuses")?;
        if let Some(merge) = self
            .number("clip.vision.spatial_merge_size")
            .filter(|merge| *merge != 2)
        {
            return Err(invalid(format!(
                "its spatial merge size is {merge}; Qwen's graph merges 2 by 2"
            )));
        }
        let head_dim = width / tower.heads;
        if head_dim < 4 || !head_dim.is_multiple_of(4) {
            return Err(invalid(format!(
                "its head dimension {head_dim} does not split into four rotary sections"
            )));
        }
        for key in ["clip.vision.image_min_pixels", "clip.vision.image_max_pixels"] {
            if self.number(key) == Some(0) {
                return Err(invalid(format!("its key {key} is 0")));
            }
        }
        if kind != "qwen2vl_merger" {
            let window_pattern = self.required("clip.vision.n_wa_pattern")?;
            let projection = self.required("clip.vision.projection_dim")?;
            if window_pattern > 0 && projection != text_width {
                return Err(invalid(format!(
                    "its projection_dim {projection} is not the text model's width {text_width}"
                )));
            }
        }
        self.check_blocks(tower, false, true)?;
        self.check_mlp_head("mm.0", "mm.2", 4 * width, text_width)
    }

    fn check_ultravox(&self, tower: &Tower, text_width: u64) -> Result<()> {
        let width = tower.width;
        let mel_bins = self.required("clip.audio.num_mel_bins")?;
        if !(1..=MAX_MEL_BINS).contains(&mel_bins) {
            return Err(invalid(format!(
                "its {mel_bins} mel bins are not from 1 to {MAX_MEL_BINS}"
            )));
        }
        let stack = self.required(STACK_FACTOR_KEY)?;
        if stack == 0 || !AUDIO_POSITIONS.is_multiple_of(stack) {
            return Err(invalid(format!(
                "its stack factor {stack} does not divide the {AUDIO_POSITIONS} positions of a chunk"
            )));
        }
        let kernel = self.conv_kernel("a.conv1d.1.weight")?;
        self.require("a.conv1d.1.weight", &[kernel, mel_bins, width])?;
        self.require("a.conv1d.1.bias", &[1, width])?;
        self.require("a.conv1d.2.weight", &[kernel, width, width])?;
        self.require("a.conv1d.2.bias", &[1, width])?;
        self.check_position_rows("a.position_embd.weight", width, AUDIO_POSITIONS, false)?;
        self.check_blocks(tower, false, false)?;
        for layer in 0..tower.layers {
            let name = |suffix: &str| format!("a.blk.{layer}.{suffix}");
            for required in [
                "ln1.weight",
                "ln1.bias",
                "ln2.weight",
                "ln2.bias",
                "attn_q.bias",
                "attn_v.bias",
            ] {
                self.require(&name(required), &[width])?;
            }
            self.forbid(&name("attn_k.bias"), "which Whisper's graph refuses")?;
        }
        let hidden = self.width_of("mm.a.norm_mid.weight", 0)?;
        self.require("mm.a.norm_pre.weight", &[width * stack])?;
        self.require("mm.a.mlp.1.weight", &[width * stack, 2 * hidden])?;
        self.require("mm.a.mlp.2.weight", &[hidden, text_width])
    }

    /// The kernel size of a 1-D convolution's weight: odd, so that the stride-2 pair keeps the
    /// positions the graph adds the table to.
    fn conv_kernel(&self, name: &str) -> Result<u64> {
        let dims = self
            .dims(name)
            .ok_or_else(|| invalid(format!("it lacks the tensor {name}")))?;
        match dims.first() {
            Some(kernel) if !kernel.is_multiple_of(2) => Ok(*kernel),
            _ => Err(invalid(format!(
                "its convolution {name} has dimensions {dims:?}; its kernel must be odd"
            ))),
        }
    }
}

fn same(name: &str, found: &[u64], expected: &[u64]) -> Result<()> {
    let mut expected = expected.to_vec();
    while expected.len() > 1 && expected.last() == Some(&1) {
        expected.pop();
    }
    if found == expected.as_slice() {
        Ok(())
    } else {
        Err(invalid(format!(
            "its tensor {name} has dimensions {found:?}, where its projector type reads {expected:?}"
        )))
    }
}
