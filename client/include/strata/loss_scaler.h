// LossScaler: dynamic loss scaling for FP16 training. The loss (and so every
// gradient) is multiplied by scale(); a step whose gradients overflow is
// skipped and the scale lowered; after `growth_interval` good steps in a row
// it is raised. A static scaler never changes. Not thread-safe.
#ifndef STRATA_LOSS_SCALER_H_
#define STRATA_LOSS_SCALER_H_

namespace strata {

struct LossScaleOptions {
  bool dynamic = true;
  float initial_scale = 65536.0f;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int growth_interval = 1000;
  float min_scale = 1.0f;
};

class LossScaler {
 public:
  explicit LossScaler(const LossScaleOptions& options)
      : options_(options), scale_(options.initial_scale) {}

  float scale() const { return scale_; }
  int good_steps() const { return good_steps_; }
  // Takes the state of another worker's scaler (a worker joining a job).
  void Restore(float scale, int good_steps) {
    scale_ = scale;
    good_steps_ = good_steps;
  }

  // Records the outcome of a step: lowers the scale on overflow, raises it
  // after a run of good steps.
  void Update(bool overflow) {
    if (!options_.dynamic) return;
    if (overflow) {
      scale_ = scale_ * options_.backoff_factor;
      if (scale_ < options_.min_scale) scale_ = options_.min_scale;
      good_steps_ = 0;
    } else if (++good_steps_ >= options_.growth_interval) {
      scale_ = scale_ * options_.growth_factor;
      good_steps_ = 0;
    }
  }

 private:
  LossScaleOptions options_;
  float scale_;
  int good_steps_ = 0;
};

}  // namespace strata

#endif  // STRATA_LOSS_SCALER_H_
