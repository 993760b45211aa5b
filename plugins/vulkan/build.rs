// The plugin links the CPU backend (its fallback), whose crate also defines the plugin entry symbol
// `kazeia_backend_plugin_v1` for its own cdylib. When the CPU crate's object holding that symbol is pulled into
// this cdylib (release builds put it in a code-generation unit with code we use) the link fails on a duplicate
// definition. The linker takes the first definition, which is this crate's own (its objects come before the
// dependencies' archives), and drops the other. The clean fix is for the CPU crate to put its entry symbol behind
// a default feature this crate turns off.
fn main() {
    // ELF linkers (GNU ld, lld, gold) spell it `-z muldefs`.
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if matches!(os.as_str(), "linux" | "android" | "freebsd") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,muldefs");
    }
}
