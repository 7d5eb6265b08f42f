//! `da3 serve`'s `/v1/depth` form (`cli/src/cmd/serve/form.rs`, included as is): multipart
//! bytes under a content type, read and checked as the server does. The first byte picks the
//! content type (usually a fixed multipart boundary, sometimes a type taken from the input) and
//! the rules (views allowed, which optional outputs the model has). Never a panic, never a
//! status other than 4xx, and an accepted form always within the rules.
#![no_main]

#[path = "../../cli/src/cmd/serve/form.rs"]
#[allow(dead_code)]
mod form;

use axum::body::Bytes;

const BOUNDARY: &str = "da3-fuzz-boundary";

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
}

fn check(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let (content_type, body) = if selector & 0x80 == 0 {
        (format!("multipart/form-data; boundary={BOUNDARY}"), rest)
    } else {
        // A content type of the input's own: up to the first newline.
        let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
        let (line, body) = rest.split_at(end);
        (
            String::from_utf8_lossy(line).into_owned(),
            body.get(1..).unwrap_or_default(),
        )
    };
    let rules = form::Rules {
        max_upload_bytes: 1 << 20,
        max_views: 1 + (selector & 3) as usize,
        preset: "fuzz",
        has_pose: selector & 4 != 0,
        has_sky: selector & 8 != 0,
        has_confidence: selector & 16 != 0,
    };
    let result = RUNTIME.with(|runtime| {
        runtime.block_on(form::parse(
            &content_type,
            Bytes::copy_from_slice(body),
            &rules,
        ))
    });
    match result {
        Ok(form) => {
            assert!(!form.files.is_empty() && form.files.len() <= rules.max_views);
            if let Some(res) = form.process_res {
                assert!(
                    (da3::preprocess::PATCH_SIZE..=da3::preprocess::MAX_PROCESS_RES).contains(&res)
                );
            }
            for (i, output) in form.outputs.iter().enumerate() {
                assert!(!form.outputs[..i].contains(output), "{:?}", form.outputs);
                let allowed = match output {
                    form::Output::Pose => rules.has_pose,
                    form::Output::SkyF32 => rules.has_sky,
                    form::Output::ConfidenceF32 => rules.has_confidence,
                    _ => true,
                };
                assert!(allowed, "{output:?} accepted without the model having it");
            }
        }
        Err(e) => assert!(
            e.status.is_client_error(),
            "{} for a client's bytes: {}",
            e.status,
            e.message
        ),
    }
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| check(data));
