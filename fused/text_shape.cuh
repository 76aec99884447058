// The text model's sizes, fixed at compile time: the launch layer (src/text/gpu/) passes the model's
// embedding width and hidden width as -DTEXT_D / -DTEXT_H, so per-lane register arrays have constant bounds.
#pragma once

#ifndef TEXT_D
#define TEXT_D 64
#endif
#ifndef TEXT_H
#define TEXT_H 256
#endif

constexpr int D = TEXT_D;
constexpr int H = TEXT_H;
constexpr int DP = (D + 31) / 32;  // elements of a D-vector per lane of a warp
