//! Compiles the work limit of llama.cpp's Jinja engine (`src/work_limit.cpp`) and wraps
//! `operator new` with it: every allocation of the C++ code linked into the extension passes
//! through the limit, which counts only while a thread has one.

fn main() {
    println!("cargo:rerun-if-changed=src/work_limit.cpp");
    cc::Build::new()
        .cpp(true)
        // llama-cpp-sys-4 links the C++ runtime it was built with (libstdc++, or zig's libc++).
        .cpp_link_stdlib(None)
        .std("c++17")
        .file("src/work_limit.cpp")
        .compile("llamactx_work_limit");
    for symbol in ["_Znwm", "_Znam"] {
        println!("cargo:rustc-link-arg=-Wl,--wrap={symbol}");
    }
}
