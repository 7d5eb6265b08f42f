/* The C API of da3 from start to end: a single image, a scene of two views with their
 * cameras, exports, and what an error looks like.
 *
 *   cc -I capi/include capi/examples/example.c target/release/libda3.a \
 *      -lstdc++ -lm -lpthread -ldl -o example
 *   ./example MODEL.gguf IMAGE OUT_DIR
 *
 * Every da3_ call that can fail returns a da3_status; da3_last_error() says why. */
#include "da3.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Prints what failed and returns 0 when `status` is not DA3_STATUS_OK. */
static int ok(da3_status status, const char *what) {
    if (status == DA3_STATUS_OK) return 1;
    fprintf(stderr, "%s failed (status %d): %s\n", what, (int)status, da3_last_error());
    return 0;
}

/* A new image: `image` mirrored left to right, made from the caller's pixels. */
static da3_status mirrored(const da3_image *image, da3_image **out) {
    const uint8_t *rgb;
    size_t width, height;
    da3_status status = da3_image_pixels(image, &rgb, &width, &height);
    if (status != DA3_STATUS_OK) return status;
    uint8_t *flipped = malloc(width * height * 3);
    if (flipped == NULL) return DA3_STATUS_INVALID_ARGUMENT;
    for (size_t y = 0; y < height; y++)
        for (size_t x = 0; x < width; x++)
            memcpy(&flipped[(y * width + x) * 3], &rgb[(y * width + (width - 1 - x)) * 3], 3);
    status = da3_image_from_rgb(width, height, flipped, out); /* copies the pixels */
    free(flipped);
    return status;
}

static void print_depth(const da3_output *output, size_t view) {
    const float *depth;
    size_t width, height;
    if (!ok(da3_output_depth(output, view, &depth, &width, &height), "depth")) return;
    float lo = depth[0], hi = depth[0];
    for (size_t i = 1; i < width * height; i++) {
        if (depth[i] < lo) lo = depth[i];
        if (depth[i] > hi) hi = depth[i];
    }
    printf("view %zu: depth %zux%zu, range %.4f to %.4f\n", view, width, height, lo, hi);
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf IMAGE OUT_DIR\n", argv[0]);
        return 2;
    }
    const char *model_path = argv[1], *image_path = argv[2], *out_dir = argv[3];
    char path[4096];
    int failed = 1;
    da3_model *model = NULL;
    da3_session *session = NULL;
    da3_image *image = NULL, *mirror = NULL;
    da3_output *single = NULL, *scene = NULL;

    printf("da3 %s\n", da3_version());

    /* The model: loaded once, shareable by every thread. A small process resolution keeps
     * this example fast; 0 would mean the official 504. */
    da3_load_options load = da3_load_options_default();
    load.device = "cpu";
    load.threads = 2;
    load.process_res = 112;
    if (!ok(da3_model_load(model_path, &load, &model), "da3_model_load")) goto done;
    const char *device;
    if (!ok(da3_model_device(model, &device), "da3_model_device")) goto done;
    printf("model on %s\n", device);

    /* A session computes, one run at a time, on this thread. */
    if (!ok(da3_session_new(model, &session), "da3_session_new")) goto done;
    if (!ok(da3_image_load(image_path, &image), "da3_image_load")) goto done;

    /* 1. One image, default run options. */
    const da3_image *one[] = {image};
    if (!ok(da3_session_run(session, one, 1, NULL, &single), "da3_session_run (single)")) goto done;
    print_depth(single, 0);
    const float *confidence;
    if (da3_output_confidence(single, 0, &confidence, NULL, NULL) == DA3_STATUS_OK)
        printf("view 0: confidence %.4f at the first pixel\n", confidence[0]);
    snprintf(path, sizeof path, "%s/depth.png", out_dir);
    if (!ok(da3_output_save_png(single, 0, path, DA3_COLORMAP_TURBO), "da3_output_save_png")) goto done;

    /* 2. A scene of two views, the image and its mirror image, computed together; the
     * cameras come out in the reference view's frame. */
    if (!ok(mirrored(image, &mirror), "mirrored")) goto done;
    const da3_image *views[] = {image, mirror};
    const char *names[] = {"photo.png", "mirror.png"};
    da3_run_options run = da3_run_options_default();
    run.reference = DA3_REFERENCE_FIRST;
    run.names = names;
    if (!ok(da3_session_run(session, views, 2, &run, &scene), "da3_session_run (scene)")) goto done;
    size_t reference;
    if (!ok(da3_output_reference(scene, &reference), "da3_output_reference")) goto done;
    printf("scene: %zu views, reference view %zu\n", da3_output_views(scene), reference);
    float extrinsics[2][12], intrinsics[2][9];
    for (size_t v = 0; v < da3_output_views(scene); v++) {
        print_depth(scene, v);
        da3_status status = da3_output_pose(scene, v, extrinsics[v], intrinsics[v]);
        if (status == DA3_STATUS_NOT_AVAILABLE) {
            printf("view %zu: the model predicts no camera\n", v);
            continue;
        }
        if (!ok(status, "da3_output_pose")) goto done;
        printf("view %zu: extrinsics (world to camera)\n", v);
        for (int row = 0; row < 3; row++)
            printf("  % .5f % .5f % .5f % .5f\n", extrinsics[v][row * 4], extrinsics[v][row * 4 + 1],
                   extrinsics[v][row * 4 + 2], extrinsics[v][row * 4 + 3]);
        printf("view %zu: fx %.2f fy %.2f cx %.2f cy %.2f\n", v, intrinsics[v][0], intrinsics[v][4],
               intrinsics[v][2], intrinsics[v][5]);
    }

    /* 3. Exports: the scene's points in one PLY, its cameras as JSON. */
    da3_export_options export_options = da3_export_options_default();
    snprintf(path, sizeof path, "%s/scene.ply", out_dir);
    if (!ok(da3_output_save_ply(scene, DA3_ALL_VIEWS, path, &export_options), "da3_output_save_ply"))
        goto done;
    printf("wrote %s\n", path);
    snprintf(path, sizeof path, "%s/poses.json", out_dir);
    if (!ok(da3_output_save_poses_json(scene, path), "da3_output_save_poses_json")) goto done;
    printf("wrote %s\n", path);

    /* 4. Errors: a status and a message, never a crash. Known cameras need a model loaded
     * with `camera_encoder`, which this one is not. */
    da3_image *missing = NULL;
    da3_status status = da3_image_load("no-such-image.png", &missing);
    printf("loading a missing image: status %d: %s\n", (int)status, da3_last_error());
    da3_output *posed = NULL;
    run = da3_run_options_default();
    run.extrinsics = extrinsics[0];
    run.intrinsics = intrinsics[0];
    status = da3_session_run(session, views, 1, &run, &posed);
    printf("known cameras without the camera encoder: status %d: %s\n", (int)status,
           da3_last_error());
    da3_output_free(posed); /* NULL after a failure: freeing it is a no-op */
    status = da3_output_depth(scene, 7, &confidence, NULL, NULL);
    printf("view 7 of 2: status %d: %s\n", (int)status, da3_last_error());

    failed = 0;
done:
    da3_output_free(scene);
    da3_output_free(single);
    da3_image_free(mirror);
    da3_image_free(image);
    if (session != NULL && !ok(da3_session_free(session), "da3_session_free")) failed = 1;
    da3_model_free(model);
    printf("%s\n", failed ? "failed" : "done");
    return failed;
}
