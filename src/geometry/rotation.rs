//! Rotation matrices and unit quaternions, in the two component orders this crate meets:
//! `(w, x, y, z)` (COLMAP, 3DGS files) and `(x, y, z, w)` (PyTorch3D's and the official DA3
//! code's). Matrices are row-major `[[f64; 3]; 3]`.

/// The rotation of quaternion `(x, y, z, w)`, which need not be unit: `2 / |q|^2` scales the
/// products (PyTorch3D's `quaternion_to_matrix`, the official `quat_to_mat`).
pub fn matrix_of_xyzw(q: [f64; 4]) -> [[f64; 3]; 3] {
    let [i, j, k, r] = q;
    let two_s = 2.0 / (i * i + j * j + k * k + r * r);
    [
        [
            1.0 - two_s * (j * j + k * k),
            two_s * (i * j - k * r),
            two_s * (i * k + j * r),
        ],
        [
            two_s * (i * j + k * r),
            1.0 - two_s * (i * i + k * k),
            two_s * (j * k - i * r),
        ],
        [
            two_s * (i * k - j * r),
            two_s * (j * k + i * r),
            1.0 - two_s * (i * i + j * j),
        ],
    ]
}

/// The rotation of quaternion `(w, x, y, z)` (any length but zero).
pub fn matrix_of_wxyz(q: [f64; 4]) -> [[f64; 3]; 3] {
    matrix_of_xyzw([q[1], q[2], q[3], q[0]])
}

/// The unit quaternion `(w, x, y, z)` of a rotation matrix, `w >= 0` (Shepperd's method: the
/// best-conditioned of four formulas).
pub fn wxyz_of_matrix(r: &[[f64; 3]; 3]) -> [f64; 4] {
    let trace = r[0][0] + r[1][1] + r[2][2];
    let q = if trace > 0.0 {
        let s = (trace + 1.0).sqrt() * 2.0;
        [
            0.25 * s,
            (r[2][1] - r[1][2]) / s,
            (r[0][2] - r[2][0]) / s,
            (r[1][0] - r[0][1]) / s,
        ]
    } else if r[0][0] > r[1][1] && r[0][0] > r[2][2] {
        let s = (1.0 + r[0][0] - r[1][1] - r[2][2]).sqrt() * 2.0;
        [
            (r[2][1] - r[1][2]) / s,
            0.25 * s,
            (r[0][1] + r[1][0]) / s,
            (r[0][2] + r[2][0]) / s,
        ]
    } else if r[1][1] > r[2][2] {
        let s = (1.0 + r[1][1] - r[0][0] - r[2][2]).sqrt() * 2.0;
        [
            (r[0][2] - r[2][0]) / s,
            (r[0][1] + r[1][0]) / s,
            0.25 * s,
            (r[1][2] + r[2][1]) / s,
        ]
    } else {
        let s = (1.0 + r[2][2] - r[0][0] - r[1][1]).sqrt() * 2.0;
        [
            (r[1][0] - r[0][1]) / s,
            (r[0][2] + r[2][0]) / s,
            (r[1][2] + r[2][1]) / s,
            0.25 * s,
        ]
    };
    let norm = q.iter().map(|v| v * v).sum::<f64>().sqrt();
    let sign = if q[0] < 0.0 { -1.0 } else { 1.0 };
    q.map(|v| sign * v / norm)
}

/// The rotation a fraction `t` of the way from `a` to `b` (spherical linear interpolation of
/// their quaternions, the shorter way round).
pub fn slerp(a: &[[f64; 3]; 3], b: &[[f64; 3]; 3], t: f64) -> [[f64; 3]; 3] {
    let qa = wxyz_of_matrix(a);
    let mut qb = wxyz_of_matrix(b);
    let mut dot: f64 = qa.iter().zip(&qb).map(|(x, y)| x * y).sum();
    if dot < 0.0 {
        qb = qb.map(|v| -v);
        dot = -dot;
    }
    let q: [f64; 4] = if dot > 0.9995 {
        // Nearly equal: linear, renormalised by the matrix conversion.
        std::array::from_fn(|i| qa[i] + (qb[i] - qa[i]) * t)
    } else {
        let theta = dot.acos();
        let (wa, wb) = (
            ((1.0 - t) * theta).sin() / theta.sin(),
            (t * theta).sin() / theta.sin(),
        );
        std::array::from_fn(|i| wa * qa[i] + wb * qb[i])
    };
    matrix_of_wxyz(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn about_z(a: f64) -> [[f64; 3]; 3] {
        let (s, c) = a.sin_cos();
        [[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]
    }

    fn close(a: &[[f64; 3]; 3], b: &[[f64; 3]; 3]) -> bool {
        a.iter()
            .flatten()
            .zip(b.iter().flatten())
            .all(|(x, y)| (x - y).abs() < 1e-12)
    }

    /// Matrix to quaternion and back, in both orders, for rotations that take each branch of
    /// Shepperd's method; slerp halves an angle.
    #[test]
    fn quaternions_and_matrices_round_trip() {
        let half_turns = [
            about_z(0.4),
            [[1.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, -1.0]],
            [[-1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, -1.0]],
            about_z(3.0),
        ];
        for r in &half_turns {
            let q = wxyz_of_matrix(r);
            assert!(q[0] >= 0.0);
            assert!(close(&matrix_of_wxyz(q), r));
            assert!(close(&matrix_of_xyzw([q[1], q[2], q[3], q[0]]), r));
            // Not unit: the same rotation.
            assert!(close(&matrix_of_wxyz(q.map(|v| 3.0 * v)), r));
        }
        assert!(close(
            &slerp(&about_z(0.2), &about_z(1.0), 0.5),
            &about_z(0.6)
        ));
    }
}
