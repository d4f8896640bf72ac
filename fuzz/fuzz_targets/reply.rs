//! See `laconic::fuzzing::reply`: the property lives in the library, where
//! the property tests check it too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    laconic::fuzzing::reply(data);
});
