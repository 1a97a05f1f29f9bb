//! LoRA adapters and control vectors on a context.

use std::sync::Arc;

use super::OpenContext;
use crate::errors::{Error, Result};
use crate::lora::{AdapterLease, LoraAdapter};

/// `scale` when it is finite (an adapter's weight); `ValueError` otherwise.
pub fn check_scale(scale: f32) -> Result<f32> {
    if scale.is_finite() {
        Ok(scale)
    } else {
        Err(Error::value(format!("scale must be finite, got {scale}")))
    }
}

impl OpenContext {
    /// Applies `adapter` with weight `scale` (`lora_adapter_set`, and an engine's adapter),
    /// keeping it alive while set. `ValueError` for a scale that is not finite or an adapter of
    /// another model.
    pub fn set_lora(&mut self, adapter: Arc<LoraAdapter>, scale: f32) -> Result<()> {
        check_scale(scale)?;
        if !Arc::ptr_eq(adapter.model(), self.model()) {
            return Err(Error::value("this adapter was loaded for another model"));
        }
        // Leased before use, so `close()` refuses from here on.
        let lease = AdapterLease::new(adapter);
        self.apply_lora(&lease, scale)?;
        self.lora = Some(lease);
        Ok(())
    }

    /// Sets the adapter already set (`set_lora`) at `scale` instead. `ValueError` without one,
    /// or for a scale that is not finite.
    pub fn set_lora_scale(&mut self, scale: f32) -> Result<()> {
        check_scale(scale)?;
        let lease = self.lora.take().ok_or_else(|| Error::value("no LoRA adapter is set"))?;
        let applied = self.apply_lora(&lease, scale);
        self.lora = Some(lease);
        applied
    }

    /// Sets `lease`'s adapter on the context at `scale` (llama.cpp's `llama_set_adapter_lora`).
    pub fn apply_lora(&mut self, lease: &AdapterLease, scale: f32) -> Result<()> {
        let mut guard = lease.adapter().lock()?;
        let raw = guard.as_mut().ok_or_else(|| Error::closed("LlamaLoraAdapter"))?;
        self.with_mut(|context| context.lora_adapter_set(&mut raw.0, scale))?;
        Ok(())
    }
}
