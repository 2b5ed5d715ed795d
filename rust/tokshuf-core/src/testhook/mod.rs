//! Test-only hooks for the crash, disk-full and follow-mode tests (`hooks`), compiled only with
//! the cargo feature `testhooks`. Without it (the wheel) every hook is an empty inline
//! function, so nothing in a user's build reads the `TOKSHUF_TEST_*` variables.

#[cfg(feature = "testhooks")]
mod hooks;
#[cfg(feature = "testhooks")]
pub use hooks::{charge, init, point};

#[cfg(not(feature = "testhooks"))]
mod inert {
    #[inline(always)]
    pub fn init() {}
    #[inline(always)]
    pub fn point(_name: &str) {}
    #[inline(always)]
    pub fn charge(_n: usize) -> std::io::Result<()> {
        Ok(())
    }
}
#[cfg(not(feature = "testhooks"))]
pub use inert::{charge, init, point};
