/*
 * optim.h — the reference trainer's optimizer: AdamW (decoupled weight
 * decay, bias correction, PyTorch's update rule), the learning-rate
 * schedule (linear warm-up, cosine decay to min_lr), global-norm gradient
 * clipping and gradient scaling for accumulation over micro-batches.
 *
 * The optimizer works on one flat float buffer (the model's params/grads);
 * which ranges get weight decay is set per range. Weight decay policy used
 * by optim_create_for_model(): every 2-D tensor decays, including the token
 * embedding (as GPT-2/nanoGPT/llm.c do: it is a matrix like the others and
 * the tied lm_head is the same tensor); 1-D tensors (RMSNorm weights) do
 * not, since shrinking a norm's gain only rescales the next layer.
 *
 * Not here: saving and loading the state (checkpoint.h). Everything is
 * deterministic: sums are taken in a fixed order.
 */
#ifndef IGRAD_TRAINER_OPTIM_H
#define IGRAD_TRAINER_OPTIM_H

#include <stdint.h>

#include "igrad.h"
#include "model.h"

typedef struct optim_config {
    double lr;            /* peak learning rate (after warm-up) */
    double min_lr;        /* floor of the cosine decay */
    int64_t warmup_steps; /* linear warm-up length (0: none) */
    int64_t total_steps;  /* cosine reaches min_lr here (<= warmup: constant lr) */
    double beta1, beta2, eps;
    double weight_decay;  /* decoupled, multiplied by lr as in torch.optim.AdamW */
    double grad_clip;     /* max global gradient norm; <= 0 disables clipping */
} optim_config_t;

/* lr 3e-4, min_lr 3e-5, warm-up 0, total 0, betas (0.9, 0.95), eps 1e-8,
 * weight decay 0.1, clip 1.0. */
optim_config_t optim_config_default(void);

typedef struct optim {
    optim_config_t config;
    int64_t count;    /* floats in the parameter buffer */
    int64_t step;     /* updates taken so far (bias correction uses step + 1) */
    float *m;         /* (count) first moment */
    float *v;         /* (count) second moment */
    uint8_t *decay;   /* (count) 1 where weight decay applies */
} optim_t;

/* An optimizer for `count` floats, all with weight decay, moments zero. */
igrad_status_t optim_create(const optim_config_t *cfg, int64_t count, optim_t **out);
/* The same for a model's flat buffer with the policy described above. */
igrad_status_t optim_create_for_model(const optim_config_t *cfg, const model_t *m,
                                      optim_t **out);
void optim_free(optim_t *opt);

/* Turns weight decay on (1) or off (0) for [offset, offset + count). */
igrad_status_t optim_set_decay(optim_t *opt, int64_t offset, int64_t count, int decay);

/* Learning rate at `step` (0-based): lr * (step+1)/warmup during warm-up,
 * then lr -> min_lr along half a cosine until total_steps, min_lr after. */
double optim_lr(const optim_config_t *cfg, int64_t step);

/* Global L2 norm of grads (summed in double in a fixed order). If it is
 * finite and above max_norm > 0, scales grads by max_norm / norm.
 * @return the norm before clipping (NaN/Inf are returned as they are and
 * nothing is scaled: the caller should skip the step). */
double optim_clip_grad_norm(float *grads, int64_t count, double max_norm);

/* grads *= scale (e.g. 1/micro_batches after accumulating). */
void optim_scale(float *grads, int64_t count, float scale);

/* One AdamW update with learning rate `lr`, as torch.optim.AdamW:
 *   p *= 1 - lr*wd (decay ranges only); m = b1 m + (1-b1) g;
 *   v = b2 v + (1-b2) g^2; p -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)
 * with bc_i = 1 - beta_i^(step+1); then step += 1. Clipping is separate
 * (optim_clip_grad_norm). */
void optim_update(optim_t *opt, float *params, const float *grads, double lr);

/* The same step without touching params: delta = (what optim_update would
 * write) - params, computed in float, so params + delta is optim_update's
 * result whenever the subtraction is exact (Sterbenz: the new value within
 * a factor 2 of the old). Moments and step advance as in optim_update.
 * delta may be grads (each element is read before it is written); it must
 * not overlap params. For error feedback on the update (--ef-on update). */
void optim_update_delta(optim_t *opt, const float *params, const float *grads, double lr,
                        float *delta);

#endif /* IGRAD_TRAINER_OPTIM_H */
