"""What the sampler samples, pinned: same seed, same tokens, structure and log-probs.

The sampler's per-step bookkeeping and its cache (`nanopar/kvcache.py`) are written for speed;
a change there must not move a single sampled token. So the rollouts of fixed seeds are pinned:
a hash of every rollout's tokens, sampled mask, finish and structure (exact), and each rollout's
summed log-prob (to 1e-4; the per-token check against the trainer is in tests/test_sampler.py
and tests/test_npr_schema.py). Both tag schemas, both attention modes, shared and disjoint path
positions, plain decoding, greedy, top-k/top-p, and batches where many lanes finish early (the
cache rebuild's case). The plain cache (`LaneCache`) and the lazy one (`LazyLaneCache`, the
default) must give the very same rollouts, bit for bit.

Regenerate (only when a change *means* to change what is sampled): `python tests/test_sampler_pins.py`
prints the pins, one line each.
"""

import hashlib
import json

import pytest
import torch

from conftest import A, A_, EOS, NPR_TAGS, P, P_, S, TAGS, V, follow_bias, npr_writer, rule_model, tag_biased_model
from nanopar.kvcache import LaneCache
from nanopar.policy import Policy
from nanopar.sampler import SamplerSettings, sample

PROMPTS = [[1, 2, 3], [4, 5, 6, 8, 9, 10, 11], [12, 13, 14, 15, 16]]


def parallel_r1_causal_model():
    return follow_bias(tag_biased_model(tag_bias=2.5, eos_bias=0.5), {(P, A): 5.0, (A_, A): 3.0, (A_, P_): 3.0, (P_, S): 5.0})


# name -> (model factory, policy, settings, samples per prompt)
CASES = {
    "p-r1 structured shared": (lambda: tag_biased_model(2.5, 1.0), Policy(TAGS),
                               SamplerSettings(max_new_tokens=60, max_path_tokens=12, paths=3, seed=0), 4),
    "p-r1 structured disjoint": (lambda: tag_biased_model(2.5, 1.0), Policy(TAGS, path_stride=14),
                                 SamplerSettings(max_new_tokens=60, max_path_tokens=12, paths=3, seed=1), 4),
    "p-r1 structured many lanes": (lambda: tag_biased_model(3.0, 2.0), Policy(TAGS),
                                   SamplerSettings(max_new_tokens=48, max_path_tokens=10, paths=2, max_blocks=2, seed=2), 16),
    "p-r1 structured top-k top-p": (lambda: tag_biased_model(2.5, 1.0), Policy(TAGS, temperature=0.8),
                                    SamplerSettings(max_new_tokens=50, max_path_tokens=9, paths=4, top_k=40, top_p=0.9, seed=3), 6),
    "p-r1 causal": (parallel_r1_causal_model, Policy(TAGS, "causal"),
                    SamplerSettings(max_new_tokens=60, max_path_tokens=8, max_blocks=2, seed=4), 12),
    "p-r1 greedy": (rule_model, Policy(TAGS, temperature=0), SamplerSettings(max_new_tokens=40, max_path_tokens=6, paths=2), 1),
    "plain": (lambda: tag_biased_model(0.0, 1.5), Policy(None), SamplerSettings(max_new_tokens=40, seed=5), 8),
    "npr structured shared": (npr_writer, Policy(NPR_TAGS, "structured", 1.0, V, 0),
                              SamplerSettings(paths=3, max_new_tokens=120, max_path_tokens=8, max_blocks=3, seed=6), 8),
    "npr structured strided": (lambda: npr_writer("qwen2"), Policy(NPR_TAGS, "structured", 1.0, V, 12),
                               SamplerSettings(paths=3, max_new_tokens=120, max_path_tokens=8, max_blocks=3, seed=7), 8),
    "npr causal": (lambda: npr_writer(causal=True), Policy(NPR_TAGS, "causal", 1.0, V, 0),
                   SamplerSettings(paths=3, max_new_tokens=120, max_path_tokens=8, max_blocks=3, seed=8), 8),
}

# name -> (sha256 of the rollouts' tokens and structure, first 16 hex; summed log-prob per rollout)
PINNED = {
    'npr causal': ('00cb9f5f33808c15', [
        -113.08805, -618.84047, -182.51815, -450.92624, -509.89583, -479.80739, -511.39852, -578.89165,
        -578.45755, -555.4105, -111.4557, -543.93365, -512.98522, -525.05472, -16.92635, -344.4826,
        -526.39418, -523.55726, -515.19953, -32.55172, -352.93361, -566.85257, -579.30353, -189.97438
    ]),
    'npr structured shared': ('9fdb2cce2b98b23c', [
        -611.18419, -309.32377, -614.76062, -557.50641, -601.77667, -528.73163, -583.61251, -574.27006,
        -567.74589, -541.14743, -560.58438, -407.73852, -538.35491, -611.50202, -557.08736, -537.40084,
        -551.59853, -34.41987, -550.04804, -541.8801, -574.53795, -550.31343, -536.71762, -609.31043
    ]),
    'npr structured strided': ('1827ce07fcf87a4f', [
        -533.52989, -598.08915, -568.31639, -589.5746, -534.97174, -273.89519, -515.98622, -373.62603,
        -525.05074, -452.00119, -582.18438, -520.38376, -555.93099, -537.22996, -562.99729, -596.14455,
        -603.8392, -584.2745, -549.20144, -525.05503, -567.48448, -579.47651, -563.34526, -601.07123
    ]),
    'p-r1 causal': ('933bd60777b35f68', [
        -277.29671, -46.27481, -308.45293, -266.83553, -275.77832, -295.46317, -144.8023, -316.57708,
        -295.27587, -280.47222, -219.33154, -305.81228, -137.51339, -295.9125, -275.33961, -314.19798,
        -260.21262, -16.94503, -293.27712, -283.01221, -303.11456, -236.37343, -29.48381, -285.99322,
        -52.46581, -301.40681, -291.0222, -266.73845, -269.50082, -284.91195, -286.662, -254.63478,
        -304.04369, -265.65438, -272.26373, -278.70006
    ]),
    'p-r1 greedy': ('bc58eb157088482a', [
        -119.45097, -129.51707, -143.8731
    ]),
    'p-r1 structured disjoint': ('b0a1640d2b21b4f9', [
        -318.4493, -308.90489, -294.40673, -62.5173, -306.4842, -302.0638, -311.18179, -247.64427,
        -16.29494, -283.23551, -322.25011, -307.66064
    ]),
    'p-r1 structured many lanes': ('ff9d437d65d3252e', [
        -231.03619, -138.42486, -227.38166, -76.95367, -117.89261, -227.16315, -185.0334, -257.60841,
        -238.56047, -217.93395, -102.84934, -199.97435, -190.07591, -249.05157, -213.78201, -134.08808,
        -239.91954, -236.93454, -116.26236, -6.93675, -231.35316, -248.64384, -131.58139, -211.05987,
        -233.76726, -239.85937, -183.06456, -250.88568, -185.29518, -10.08704, -225.26208, -235.27154,
        -238.82361, -219.93426, -232.29187, -21.4299, -150.96456, -212.8045, -224.68275, -218.99432,
        -252.35835, -3.90651, -112.62402, -246.86977, -50.9298, -19.33807, -246.96783, -36.23758
    ]),
    'p-r1 structured shared': ('6e6eb4cc671f308d', [
        -10.74455, -320.81651, -318.97079, -310.73456, -307.57921, -313.83053, -301.35188, -301.57026,
        -320.02593, -48.32672, -308.09596, -298.10315
    ]),
    'p-r1 structured top-k top-p': ('ab9be6d29371fcff', [
        -155.4373, -138.65684, -128.81585, -4.46154, -127.73282, -152.56033, -7.83723, -154.7852,
        -150.68102, -140.63309, -146.63961, -66.55567, -153.21088, -124.26801, -67.14827, -144.92515,
        -147.34693, -20.7373
    ]),
    'plain': ('e1c39819bfd2154e', [
        -220.06746, -221.42061, -222.84712, -37.53999, -58.86103, -108.85229, -221.96044, -109.13823,
        -4.16841, -98.90324, -221.7518, -220.59949, -221.8422, -77.0516, -223.07813, -166.60846,
        -105.24302, -187.15891, -219.17802, -114.58183, -215.44357, -169.96657, -4.04793, -222.49201
    ]),
}


def run_case(name, **options):
    make, policy, settings, samples = CASES[name]
    torch.manual_seed(0)
    return sample(make(), PROMPTS, policy, settings, eos_ids=[EOS], samples_per_prompt=samples, **options)


def fingerprint(rollouts):
    record = [(r.ids, r.sampled, r.finish, r.stats.path_lengths, r.stats.forks, r.stats.stray_tags,
               r.stats.cut_paths, r.stats.sampled_tokens, r.stats.critical_path) for r in rollouts]
    digest = hashlib.sha256(json.dumps(record).encode()).hexdigest()[:16]
    return digest, [round(sum(r.logprobs), 5) for r in rollouts]


@pytest.mark.parametrize("name", sorted(CASES))
def test_pinned_seeds_sample_what_they_sampled_before_with_either_cache(name):
    lazy = run_case(name)  # the default cache
    digest, sums = fingerprint(lazy)
    pinned_digest, pinned_sums = PINNED[name]
    assert digest == pinned_digest, f"{name}: the sampled tokens or structure changed"
    assert len(sums) == len(pinned_sums)
    assert max(abs(a - b) for a, b in zip(sums, pinned_sums)) <= 1e-4, f"{name}: log-probs moved"
    plain = run_case(name, lane_cache=LaneCache)
    assert [(r.ids, r.sampled, r.logprobs, r.finish, r.stats.path_lengths) for r in plain] == \
           [(r.ids, r.sampled, r.logprobs, r.finish, r.stats.path_lengths) for r in lazy], f"{name}: the caches differ"
    assert fingerprint(plain)[0] == digest


if __name__ == "__main__":  # print the pins of the code as it is now
    for name in sorted(CASES):
        digest, sums = fingerprint(run_case(name))
        print(f"    {name!r}: ({digest!r}, {sums!r}),")
