//! What `speculative=` holds: Python's `NgramDraft` or `DraftModel` (frozen dataclasses, for
//! their documentation and `dataclasses` behaviour), read into typed options and checked here
//! once. Their constructors call `_check_speculative`; the engine and `stream`'s drafter read
//! them the same way.

use llama_cpp_4::model::LlamaModel;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use crate::engine::draft_model::check_can_cut;
use crate::engine::{DraftChoice, NgramConfig};
use crate::errors::python::to_py;
use crate::errors::{Error, Result};
use crate::model::python::PyLlamaModel;

/// The longest repeat `NgramDraft` looks for, and its longest draft.
pub const MAX_NGRAM: u16 = 256;
/// The longest draft `DraftModel` proposes.
pub const MAX_DRAFT: u16 = 256;

/// Where drafts come from, as asked.
pub enum DraftKind {
    Ngram(NgramConfig),
    Model {
        model: Py<PyLlamaModel>,
        n_draft_max: u16,
        p_min: f32,
    },
}

/// A checked `NgramDraft` or `DraftModel`.
pub struct SpeculativeOptions {
    pub kind: DraftKind,
    /// `only_where_faster`: draft only while drafts pay (`DraftCosts`).
    pub gated: bool,
}

impl SpeculativeOptions {
    /// `value` read and checked: `TypeError` for what is neither kind (or a draft model that is
    /// not a `LlamaModel`), `ValueError` for a value out of its range.
    pub fn read(value: &Bound<'_, PyAny>) -> PyResult<Self> {
        let kinds = value.py().import("llamactx._speculative")?;
        let kind = if value.is_instance(&kinds.getattr("NgramDraft")?)? {
            let size_ngram = count(value, "size_ngram", 1, MAX_NGRAM)?;
            let size_mgram = count(value, "size_mgram", size_ngram, MAX_NGRAM)?;
            DraftKind::Ngram(NgramConfig { size_ngram, size_mgram })
        } else if value.is_instance(&kinds.getattr("DraftModel")?)? {
            let model = value.getattr("model")?;
            let Ok(model) = model.cast::<PyLlamaModel>() else {
                let kind = model.get_type().name()?;
                return Err(PyTypeError::new_err(format!("model must be a LlamaModel, got {kind}")));
            };
            let p_min: f64 = value.getattr("p_min")?.extract()?;
            if !(0.0..=1.0).contains(&p_min) {
                return Err(to_py(Error::value(format!("p_min must be in 0..=1, got {p_min}"))));
            }
            DraftKind::Model {
                model: model.clone().unbind(),
                n_draft_max: count(value, "n_draft_max", 1, MAX_DRAFT)?,
                // A probability loses nothing that matters in f32.
                #[allow(clippy::cast_possible_truncation)]
                p_min: p_min as f32,
            }
        } else {
            let kind = value.get_type().name()?;
            return Err(PyTypeError::new_err(format!(
                "speculative must be an NgramDraft, a DraftModel or None, got {kind}"
            )));
        };
        let gated = value.getattr("only_where_faster")?.extract()?;
        Ok(Self { kind, gated })
    }

    /// The drafts asked for, drafting for `target`: `ValueError` for a target whose cells
    /// cannot be cut (a recurrent or hybrid model cannot take back a rejected draft).
    pub fn choice(self, target: &LlamaModel) -> Result<DraftChoice> {
        check_can_cut(target)?;
        Ok(match self.kind {
            DraftKind::Ngram(config) => DraftChoice::Ngram(config),
            DraftKind::Model {
                model,
                n_draft_max,
                p_min,
            } => DraftChoice::Model {
                model: model.get().vocabulary()?,
                learned_positions: model.get().learned_positions(),
                n_draft_max: usize::from(n_draft_max),
                p_min,
            },
        })
    }
}

/// Attribute `name` of `value`: a count in `low..=high`.
fn count(value: &Bound<'_, PyAny>, name: &str, low: u16, high: u16) -> PyResult<u16> {
    let given: i64 = value.getattr(name)?.extract()?;
    u16::try_from(given)
        .ok()
        .filter(|count| (low..=high).contains(count))
        .ok_or_else(|| to_py(Error::value(format!("{name} must be in {low}..={high}, got {given}"))))
}

/// Checks `NgramDraft`'s and `DraftModel`'s values when they are made.
#[pyfunction]
#[pyo3(name = "_check_speculative")]
pub fn check_speculative(speculative: &Bound<'_, PyAny>) -> PyResult<()> {
    SpeculativeOptions::read(speculative).map(|_| ())
}
