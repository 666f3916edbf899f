/* Data-parallel training with hcomm: every rank holds a different shard of the data and the
 * same model (a linear regression), computes the gradient on its shard, and an all-reduce
 * averages the gradients so that every rank takes the same step.
 *
 *   gcc gradient_averaging.c -o gradient_averaging -lhcomm -lm
 *   hcommrun -n 4 ./gradient_averaging
 */
#include <hcomm/hcomm.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define FEATURES 8
#define SAMPLES_PER_RANK 256
#define STEPS 100
#define LEARNING_RATE 0.1f

/* Stops the job with hcomm's explanation when a call fails. */
static void check(int rc, const char *what) {
    if (rc != HCOMM_SUCCESS) {
        fprintf(stderr, "%s failed: %s\n  %s\n", what, hcommGetErrorString(rc),
                hcommGetLastErrorMessage());
        exit(1);
    }
}

/* Sample i of the whole data set: features and the target of a known model. */
static float feature(long i, int j) { return (float)sin(0.37 * (double)i * (j + 1) + j); }
static float target(long i) {
    float y = 0.5f;
    for (int j = 0; j < FEATURES; j++) y += (float)(j - 3) * feature(i, j);
    return y;
}

int main(int argc, char **argv) {
    check(hcommInit(&argc, &argv), "hcommInit");
    int rank, size;
    check(hcommCommRank(COMM_WORLD, &rank), "hcommCommRank");
    check(hcommCommSize(COMM_WORLD, &size), "hcommCommSize");

    /* Parameters: FEATURES weights and a bias, the same on every rank. */
    float params[FEATURES + 1] = {0};
    float *grad = hcommMalloc(sizeof(float) * (FEATURES + 1));
    float loss[1];
    if (!grad) check(hcommGetLastError(), "hcommMalloc");

    for (int step = 0; step < STEPS; step++) {
        for (int j = 0; j <= FEATURES; j++) grad[j] = 0;
        loss[0] = 0;
        /* This rank's shard: samples rank*SAMPLES_PER_RANK .. (rank+1)*SAMPLES_PER_RANK-1. */
        for (long s = 0; s < SAMPLES_PER_RANK; s++) {
            long i = (long)rank * SAMPLES_PER_RANK + s;
            float pred = params[FEATURES];
            for (int j = 0; j < FEATURES; j++) pred += params[j] * feature(i, j);
            float err = pred - target(i);
            loss[0] += err * err / SAMPLES_PER_RANK;
            for (int j = 0; j < FEATURES; j++) grad[j] += 2 * err * feature(i, j) / SAMPLES_PER_RANK;
            grad[FEATURES] += 2 * err / SAMPLES_PER_RANK;
        }
        /* The average of the shards' gradients is the gradient on all the data. */
        check(hcommAllReduce(grad, grad, FEATURES + 1, HCOMM_FLOAT32, HCOMM_AVG, COMM_WORLD),
              "hcommAllReduce");
        check(hcommAllReduce(loss, loss, 1, HCOMM_FLOAT32, HCOMM_AVG, COMM_WORLD),
              "hcommAllReduce");
        for (int j = 0; j <= FEATURES; j++) params[j] -= LEARNING_RATE * grad[j];
        if (rank == 0 && step % 20 == 0) printf("step %3d  loss %.3e\n", step, loss[0]);
    }

    /* Every rank took the same steps: the largest and smallest parameters across ranks agree. */
    float hi[FEATURES + 1], lo[FEATURES + 1];
    check(hcommAllReduce(params, hi, FEATURES + 1, HCOMM_FLOAT32, HCOMM_MAX, COMM_WORLD),
          "hcommAllReduce");
    check(hcommAllReduce(params, lo, FEATURES + 1, HCOMM_FLOAT32, HCOMM_MIN, COMM_WORLD),
          "hcommAllReduce");
    float worst = 0;
    int agree = 1;
    for (int j = 0; j <= FEATURES; j++) {
        float want = j < FEATURES ? (float)(j - 3) : 0.5f;
        if (fabsf(params[j] - want) > worst) worst = fabsf(params[j] - want);
        if (hi[j] != lo[j]) agree = 0;
    }
    if (rank == 0) {
        printf("%d ranks, %d samples: final loss %.2e, largest parameter error %.2e, ranks %s\n",
               size, size * SAMPLES_PER_RANK, loss[0], worst, agree ? "agree" : "DIFFER");
    }
    hcommFree(grad);
    check(hcommFinalize(), "hcommFinalize");
    return agree && worst < 1e-2f ? 0 : 1;
}
