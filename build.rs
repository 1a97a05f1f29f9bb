//! Compiles the one C++ function llamactx needs of its own (`src/regex_check.cpp`).

fn main() {
    println!("cargo:rerun-if-changed=src/regex_check.cpp");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/regex_check.cpp")
        .compile("llamactx_regex_check");
}
