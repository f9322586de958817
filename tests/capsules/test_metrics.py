"""Part purity on hand-made decodings: pure capsules, known mixtures, unlabelled points, errors."""

from __future__ import annotations

import math

import pytest
import torch

from capsules.metrics import NO_PART_LABELS, capsule_parts, capsule_purity, part_purity, patch_spread


def _two_part_shape() -> tuple[torch.Tensor, torch.Tensor]:
    """Part 0 at x = -1 and part 1 at x = +1, 4 points each."""
    y = torch.linspace(0, 1, 4)
    left = torch.stack([-torch.ones(4), y, torch.zeros(4)], 1)
    right = torch.stack([torch.ones(4), y, torch.zeros(4)], 1)
    return torch.cat([left, right])[None], torch.tensor([[0] * 4 + [1] * 4])


def test_pure_capsules_score_one() -> None:
    points, parts = _two_part_shape()
    recon = points + 0.01  # decoded point i sits next to input point i
    cap = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])  # capsule 0 = part 0, capsule 1 = part 1
    torch.testing.assert_close(capsule_purity(recon, cap, points, parts), torch.ones(1, 2))
    assert part_purity(recon, cap, points, parts) == 1.0


def test_known_mixtures() -> None:
    points, parts = _two_part_shape()
    recon = points + 0.01
    # capsule 0: 3 points of part 0 and 1 of part 1 -> 3/4; capsule 1: 1 and 1 -> 1/2; capsule 2: part 1 only
    cap = torch.tensor([0, 0, 0, 1, 0, 2, 2, 1])
    torch.testing.assert_close(capsule_purity(recon, cap, points, parts), torch.tensor([[0.75, 0.5, 1.0]]))
    assert part_purity(recon, cap, points, parts) == pytest.approx(0.75)
    # two shapes average over all capsules of both
    recon2, points2, parts2 = recon.repeat(2, 1, 1), points.repeat(2, 1, 1), parts.repeat(2, 1)
    parts2[1] = 0  # the second shape is a single part: purity 1 everywhere
    assert part_purity(recon2, cap, points2, parts2) == pytest.approx((0.75 + 0.5 + 1 + 1 + 1 + 1) / 6)


def test_nearest_input_decides_the_label() -> None:
    points, parts = _two_part_shape()
    recon = torch.zeros(1, 3, 3)
    recon[0, :, 0] = torch.tensor([-0.9, 0.8, 0.9])  # nearest: part 0, part 1, part 1
    cap = torch.tensor([0, 0, 0])
    torch.testing.assert_close(capsule_purity(recon, cap, points, parts, num_capsules=2)[0, 0], torch.tensor(2 / 3))
    assert math.isnan(float(capsule_purity(recon, cap, points, parts, num_capsules=2)[0, 1]))  # no points: NaN


def test_capsule_parts_names_each_capsules_majority_part() -> None:
    points, parts = _two_part_shape()
    recon = points + 0.01
    cap = torch.tensor([0, 0, 0, 2, 2, 2, 2, 0])  # capsule 0: 3 x part 0 + 1 x part 1; capsule 1: nothing; 2: 1 + 3
    label, purity = capsule_parts(recon, cap, points, parts, num_capsules=3)
    torch.testing.assert_close(label, torch.tensor([[0, -1, 1]]))
    torch.testing.assert_close(purity, torch.tensor([[0.75, float("nan"), 0.75]]), equal_nan=True)


def test_unlabelled_points_are_left_out() -> None:
    points, parts = _two_part_shape()
    parts = parts.clone()
    parts[0, 4:] = -1
    cap = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    out = capsule_purity(points, cap, points, parts)
    assert out[0, 0] == 1 and math.isnan(float(out[0, 1]))
    assert math.isnan(part_purity(points, cap, points, torch.full_like(parts, -1)))


def test_errors_name_the_expected_shapes() -> None:
    points, parts = _two_part_shape()
    with pytest.raises(ValueError, match=r"point_capsule must be \(8,\)"):
        capsule_purity(points, torch.zeros(5, dtype=torch.long), points, parts)
    with pytest.raises(ValueError, match=r"parts must be \(B, N\)"):
        capsule_purity(points, torch.zeros(8, dtype=torch.long), points, parts[:, :3])


def test_patch_spread_is_about_one_for_scattered_and_small_for_compact_patches() -> None:
    torch.manual_seed(0)
    recon = torch.rand(2, 600, 3)
    scattered = torch.arange(600) % 6  # every capsule's points all over the cloud
    assert patch_spread(recon, scattered) == pytest.approx(1.0, abs=0.05)
    compact = (recon[0, :, 0] * 6).long().clamp(max=5)  # slabs along x (for the first cloud)
    assert patch_spread(recon[:1], compact) < 0.8
    points, _ = _two_part_shape()
    two = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])  # each capsule one side: spread = 0.5 / mean distance to the centre
    expected = float(
        ((points[0, :4] - points[0, :4].mean(0)).norm(dim=-1).mean())
        / (points[0] - points[0].mean(0)).norm(dim=-1).mean()
    )
    assert patch_spread(points, two) == pytest.approx(expected)
    with pytest.raises(ValueError, match="point_capsule"):
        patch_spread(points, two[:3])


def test_purity_on_data_without_part_labels_reads_no_part_labels() -> None:
    """The test metrics of a run on unlabelled shapes (ModelNet, a cloud folder) say so instead of NaN; with labels they
    are numbers, and the patch spread is a number either way."""
    from torch import nn

    from capsules.recipe import evaluate

    class Copy(nn.Module):  # decodes each input point as itself, point i in capsule i % 4
        num_latent = 4
        point_capsule = torch.arange(16) % 4

        def forward(self, points: torch.Tensor) -> torch.Tensor:
            return points

    points = torch.rand(2, 16, 3, generator=torch.Generator().manual_seed(0))
    unlabelled = evaluate(Copy(), [(points, torch.full((2, 16), -1))], torch.device("cpu"))
    assert unlabelled["test_part_purity"] == unlabelled["test_part_purity_chance"] == NO_PART_LABELS == "no part labels"
    assert 0 < unlabelled["test_patch_spread"] < 2
    labelled = evaluate(Copy(), [(points, (torch.arange(16) % 4).expand(2, 16))], torch.device("cpu"))
    assert labelled["test_part_purity"] == 1.0 and isinstance(labelled["test_part_purity_chance"], float)
