//! The 8-bit colour maps against matplotlib: its `bytes=True` colours at 1001 values in
//! [0, 1] (tests/fixtures/colormaps.json, written by tests/reference/colormaps.py).

use da3::Colormap;

#[test]
fn viridis_and_inferno_are_matplotlibs_at_every_sampled_value() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/colormaps.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let xs: Vec<f64> = json["x"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(xs.len(), 1001);
    for (map, name) in [
        (Colormap::Viridis, "viridis"),
        (Colormap::Inferno, "inferno"),
    ] {
        let want = json[name].as_array().unwrap();
        for (x, want) in xs.iter().zip(want) {
            let want: Vec<u8> = want
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap() as u8)
                .collect();
            assert_eq!(map.rgb(*x as f32).to_vec(), want, "{name}({x})");
        }
    }
}
