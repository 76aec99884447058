// Shared device helpers for every fused pipeline: warp and block reductions.
#pragma once
