// The plugin links the CPU backend (its fallback), whose crate also defines the plugin entry symbol
// `kazeia_backend_plugin_v1` for its own cdylib. Release builds can pull the CPU crate's object holding that
// symbol into this cdylib and the link then fails on a duplicate definition; with `-z muldefs` the linker keeps
// the first definition, this crate's own (its objects come before the dependencies' archives). The same
// workaround as the Vulkan plugin's, so plugins/cpu stays untouched.
fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if matches!(os.as_str(), "linux" | "android" | "freebsd") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,muldefs");
    }
}
