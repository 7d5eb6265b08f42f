//! 3D Gaussians without a trained Gaussian head: one Gaussian per pixel of an image, draped
//! over a depth made up from its colours (flat shapes in front of a tilted backdrop, a round
//! yellow shape bulging out), written as a 3DGS PLY file and rendered along the official
//! `extend` camera path of two cameras, one frame saved as PNG. What the README's pictures of
//! `da3 view` and `--gs-video` show: the weights these tools are tested with are untrained,
//! and untrained Gaussians are noise.
//!
//! ```text
//! cargo run --release --example gaussian_scene -- tests/fixtures/peer/test-640x480.png out/
//! da3 view out/gaussians.ply
//! ```

use da3::export::{write_gaussian_ply, GaussianPlyOptions};
use da3::gaussians::{camera_path, render, Gaussians, Trajectory};
use da3::{Colormap, Pose};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [image, out] = args.as_slice() else {
        return Err("usage: gaussian_scene IMAGE OUT_DIR".into());
    };
    let out = PathBuf::from(out);
    std::fs::create_dir_all(&out)?;
    let image = da3::load_image(image)?;
    // Half size: a Gaussian per second pixel.
    let (w, h) = (image.width / 2, image.height / 2);
    let pixel = |x: usize, y: usize| -> [f32; 3] {
        let p = 3 * ((2 * y) * image.width + 2 * x);
        std::array::from_fn(|k| image.data[p + k] as f32 / 255.0)
    };
    let f = 1.1 * w as f32;
    let camera = |x: f32, yaw: f32| -> Pose {
        let (s, c) = yaw.sin_cos();
        let r = [[c, 0.0, -s], [0.0, 1.0, 0.0], [s, 0.0, c]];
        Pose {
            intrinsics: [
                [f, 0.0, w as f32 / 2.0],
                [0.0, f, h as f32 / 2.0],
                [0.0, 0.0, 1.0],
            ],
            extrinsics: std::array::from_fn(|i| [r[i][0], r[i][1], r[i][2], -r[i][0] * x]),
        }
    };
    let c0 = 0.282_094_8_f32;
    let mut g = Gaussians {
        views: 1,
        width: w,
        height: h,
        sh_coefficients: 1,
        ..Gaussians::default()
    };
    let mut depth = Vec::with_capacity(w * h);
    for y in 0..h {
        for x in 0..w {
            let rgb = pixel(x, y);
            let (u, v) = (
                (x as f32 + 0.5 - w as f32 / 2.0) / f,
                (y as f32 + 0.5 - h as f32 / 2.0) / f,
            );
            // The test photo's shapes, by colour inside their regions (at half size).
            let (xf, yf) = (x as f32, y as f32);
            let inside = |x0: f32, x1: f32, y0: f32, y1: f32| {
                (x0..x1).contains(&xf) && (y0..y1).contains(&yf)
            };
            let yellow =
                rgb[0] > 0.8 && rgb[1] > 0.75 && rgb[2] < 0.3 && inside(185.0, 295.0, 25.0, 135.0);
            let red =
                rgb[0] > 0.7 && rgb[1] < 0.25 && rgb[2] < 0.4 && inside(95.0, 185.0, 55.0, 205.0);
            let blue =
                rgb[0] < 0.15 && rgb[1] < 0.2 && rgb[2] > 0.6 && inside(25.0, 135.0, 145.0, 225.0);
            let d = if yellow {
                // A dome: nearer towards the shape's centre (240, 80 at this size).
                let r2 = ((x as f32 - 240.0).powi(2) + (y as f32 - 80.0).powi(2)) / 50.0f32.powi(2);
                3.0 - 0.8 * (1.0 - r2.min(1.0)).sqrt()
            } else if red {
                2.4
            } else if blue {
                2.8
            } else {
                4.0 + 1.5 * (y as f32 / h as f32)
            };
            depth.push(d);
            g.means.push([u * d, v * d, d]);
            g.scales.push([0.7 * d / f; 3]);
            g.rotations.push([1.0, 0.0, 0.0, 0.0]);
            g.harmonics.extend(rgb.map(|c| (c - 0.5) / c0));
            g.opacities.push(0.95);
        }
    }
    let all = GaussianPlyOptions {
        prune_border: false,
        max_depth_quantile: None,
        views_interval: 1,
    };
    let n = write_gaussian_ply(&out.join("gaussians.ply"), &g, &[&depth], &all)?;
    println!(
        "wrote {} ({n} Gaussians)",
        out.join("gaussians.ply").display()
    );
    let path = camera_path(&[camera(0.0, 0.0), camera(0.4, -0.12)], Trajectory::Extend);
    let frame = path.len() / 3;
    let rendered = render(&g, &path[frame], w, h, 0);
    let pixels = rendered.beside_depth(Colormap::Turbo, 2.4, 5.5);
    let png = out.join("gaussians-frame.png");
    image::save_buffer(
        &png,
        &pixels,
        2 * w as u32,
        h as u32,
        image::ColorType::Rgb8,
    )?;
    println!("wrote {} (frame {frame} of {})", png.display(), path.len());
    Ok(())
}
