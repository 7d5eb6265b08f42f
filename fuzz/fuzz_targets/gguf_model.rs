#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| da3_fuzz::gguf_model(data));
