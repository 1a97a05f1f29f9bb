//! What this CPU and its OS can run, for choosing among a wheel's builds of the extension.
//!
//! The x86-64 Linux wheel carries one build of this extension per instruction-set level
//! (`python/llamactx/_cpu.py` lists them). Its baseline build runs on every CPU the wheel
//! supports, so Python opens that one first, as a plain shared library rather than a module,
//! and asks it which features the CPU has; only then does it import the best build. The
//! detection is the standard library's: CPUID, and XGETBV for whether the OS saves AVX state.

use std::ffi::{c_char, CString};
use std::sync::OnceLock;

use pyo3::prelude::*;

/// The detected features the builds differ in, space-separated, as a NUL-terminated string
/// that lives as long as the library: what `llamactx._cpu` reads through ctypes.
#[no_mangle]
pub extern "C" fn llamactx_cpu_features() -> *const c_char {
    static FEATURES: OnceLock<CString> = OnceLock::new();
    FEATURES
        .get_or_init(|| CString::new(detected().join(" ")).unwrap_or_default())
        .as_ptr()
}

/// The features the builds of the x86-64 wheel differ in that this CPU and its OS support,
/// named as Rust's `is_x86_feature_detected!` names them.
#[pyfunction]
pub fn cpu_features() -> Vec<&'static str> {
    detected()
}

#[cfg(target_arch = "x86_64")]
fn detected() -> Vec<&'static str> {
    macro_rules! supported {
        ($($feature:tt),*) => {
            [$(($feature, std::arch::is_x86_feature_detected!($feature))),*]
        };
    }
    supported!(
        "sse3",
        "ssse3",
        "sse4.1",
        "sse4.2",
        "popcnt",
        "cmpxchg16b",
        "avx",
        "avx2",
        "fma",
        "f16c",
        "bmi1",
        "bmi2",
        "lzcnt",
        "movbe",
        "xsave",
        "avxvnni",
        "avx512f"
    )
    .into_iter()
    .filter_map(|(feature, present)| present.then_some(feature))
    .collect()
}

#[cfg(not(target_arch = "x86_64"))]
fn detected() -> Vec<&'static str> {
    Vec::new()
}
