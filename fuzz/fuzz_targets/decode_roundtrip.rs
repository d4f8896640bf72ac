//! Any input the codec accepts re-encodes to exactly the same bytes, and no
//! input makes it panic. The check itself lives in the library
//! (`laconic::wire::fuzz_roundtrip`) so the property tests run it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    laconic::wire::fuzz_roundtrip(data);
});
