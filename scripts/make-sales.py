#!/usr/bin/env python3
"""Writes a synthetic retail sales table in the schema `textnet sales` reads by default: tab-separated, no
header, one sale per line, in time order over the year 2024, with ten columns

    product name, product code, date (YYYY-MM-DD), timestamp (Unix seconds, UTC), quantity, unit price,
    category, user, total price, id

No public file of this shape exists, so this one is generated to look like real retail data: a few hundred
products in 16 categories, each with its own price (log-normal around its category's level, ending in .99)
and popularity (Zipf); mostly single items with a long tail of bulk orders; more sales on weekends, in the
summer and from Black Friday to Christmas, and some categories with their own season; total = quantity ×
unit price, less an occasional discount (about 8 % of sales) and negative for returns (about 2 %).

The output depends only on --rows and --seed (Python's Mersenne Twister, no other source of randomness).

usage: scripts/make-sales.py [--rows 366000] [--seed 1] [--out sales.tsv]
"""
import argparse, bisect, datetime, itertools, math, random, sys

YEAR = 2024
# name, typical unit price, log-normal spread of prices, typical quantity mix ("single", "pack", "bulk"),
# season (month → factor, 1 when absent)
CATEGORIES = [
    ("Electronics", 79.0, 0.8, "single", {11: 1.6, 12: 2.0}),
    ("Home & Kitchen", 24.0, 0.7, "pack", {}),
    ("Clothing", 29.0, 0.5, "pack", {3: 1.2, 4: 1.2, 9: 1.2, 10: 1.2}),
    ("Shoes", 59.0, 0.4, "single", {3: 1.2, 9: 1.3}),
    ("Beauty", 16.0, 0.6, "pack", {12: 1.5}),
    ("Health", 12.0, 0.6, "pack", {1: 1.5, 2: 1.3}),
    ("Toys & Games", 21.0, 0.7, "single", {11: 1.8, 12: 3.0}),
    ("Sports & Outdoors", 34.0, 0.7, "single", {5: 1.4, 6: 1.6, 7: 1.6, 8: 1.3}),
    ("Books", 14.0, 0.4, "pack", {8: 1.3, 12: 1.5}),
    ("Grocery", 4.5, 0.6, "bulk", {}),
    ("Garden", 22.0, 0.8, "pack", {3: 1.5, 4: 2.2, 5: 2.2, 6: 1.6, 11: 0.4, 12: 0.3, 1: 0.3}),
    ("Office Supplies", 7.0, 0.7, "bulk", {1: 1.3, 8: 1.8, 9: 1.6}),
    ("Pet Supplies", 18.0, 0.6, "pack", {}),
    ("Automotive", 31.0, 0.8, "single", {}),
    ("Jewelry", 89.0, 0.7, "single", {2: 1.8, 5: 1.3, 12: 2.2}),
    ("Baby", 19.0, 0.5, "pack", {}),
]
# Nouns of each category's products (in CATEGORIES order) and the words put before them.
NOUNS = [
    ["Headphones", "Charger", "Speaker", "Webcam", "Keyboard", "Mouse", "Monitor", "Power Bank", "Router", "Tablet"],
    ["Mug", "Pan", "Knife Set", "Cutting Board", "Kettle", "Toaster", "Blender", "Towel", "Storage Jar", "Lamp"],
    ["T-Shirt", "Hoodie", "Jeans", "Scarf", "Jacket", "Dress", "Socks", "Cap", "Sweater", "Shorts"],
    ["Sneakers", "Boots", "Sandals", "Loafers", "Running Shoes", "Slippers", "Hiking Boots", "Heels"],
    ["Lipstick", "Face Cream", "Shampoo", "Perfume", "Nail Polish", "Mascara", "Body Lotion", "Sunscreen"],
    ["Vitamins", "Bandages", "Thermometer", "Hand Gel", "Protein Powder", "Toothbrush", "Face Masks"],
    ["Puzzle", "Board Game", "Plush Bear", "Building Blocks", "Toy Car", "Doll", "Kite", "Card Game"],
    ["Yoga Mat", "Dumbbells", "Water Bottle", "Tent", "Backpack", "Bike Light", "Football", "Tennis Balls"],
    ["Novel", "Cookbook", "Atlas", "Notebook Journal", "Comic", "Biography", "Poetry Collection", "Travel Guide"],
    ["Coffee Beans", "Green Tea", "Olive Oil", "Pasta", "Chocolate Bar", "Granola", "Honey", "Rice"],
    ["Seed Pack", "Garden Hose", "Planter", "Pruning Shears", "Watering Can", "Fertilizer", "Bird Feeder"],
    ["Pens", "Stapler", "Printer Paper", "Sticky Notes", "Folder", "Desk Organizer", "Highlighters"],
    ["Dog Food", "Cat Litter", "Chew Toy", "Leash", "Pet Bed", "Fish Food", "Scratching Post"],
    ["Car Wax", "Wiper Blades", "Phone Mount", "Floor Mats", "Jump Starter", "Tire Gauge", "Air Freshener"],
    ["Necklace", "Earrings", "Bracelet", "Ring", "Watch", "Pendant", "Cufflinks"],
    ["Diapers", "Baby Wipes", "Bottle", "Pacifier", "Baby Blanket", "Teether", "Onesie"],
]
ADJECTIVES = ["Classic", "Deluxe", "Eco", "Compact", "Premium", "Everyday", "Pro", "Mini", "Large", "Vintage",
              "Smart", "Organic", "Travel", "Family", "Signature", "Basic", "Ultra", "Soft", "Bright", "Nordic"]
COLOURS = ["Black", "White", "Blue", "Red", "Green", "Grey", "Natural", "Pink", "Navy", "Gold"]

# Quantity mixes: (quantity range, weight); a weight is the share of sales in that range.
QUANTITIES = {
    "single": [((1, 1), 80), ((2, 2), 13), ((3, 4), 5), ((5, 10), 2)],
    "pack": [((1, 1), 55), ((2, 2), 20), ((3, 5), 16), ((6, 12), 7), ((13, 24), 2)],
    "bulk": [((1, 1), 30), ((2, 3), 25), ((4, 6), 20), ((7, 12), 15), ((13, 24), 7), ((25, 60), 3)],
}
DISCOUNTS = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.5]
DISCOUNT_SHARE = 0.08
RETURN_SHARE = 0.02


def day_weight(day):
    """Relative number of sales on `day` (a date of YEAR)."""
    doy = day.timetuple().tm_yday
    w = 1.0 + 0.15 * math.sin(2 * math.pi * (doy - 100) / 366)  # summer a little busier than winter
    if day.weekday() >= 5:
        w *= 1.3
    if day.month == 1 and day.day > 3:
        w *= 0.8  # the January lull
    black_friday = datetime.date(YEAR, 11, 29)
    if black_friday <= day <= black_friday + datetime.timedelta(days=3):
        w *= 2.5
    elif datetime.date(YEAR, 12, 1) <= day <= datetime.date(YEAR, 12, 23):
        w *= 1.4 + 0.6 * (day.day / 23)
    elif datetime.date(YEAR, 12, 24) <= day <= datetime.date(YEAR, 12, 26):
        w *= 0.6
    return w


def rows_per_day(rows):
    """Splits `rows` over the days of YEAR in proportion to day_weight (largest remainders)."""
    days = [datetime.date(YEAR, 1, 1) + datetime.timedelta(days=i) for i in range(366 if YEAR % 4 == 0 else 365)]
    weights = [day_weight(d) for d in days]
    total = sum(weights)
    exact = [rows * w / total for w in weights]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(days)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: rows - sum(counts)]:
        counts[i] += 1
    return list(zip(days, counts))


def make_products(rng):
    """(name, code, category index, unit price, popularity) for each product."""
    products, names = [], set()
    codes = rng.sample(range(10000, 100000), 2000)
    for c, (category, level, spread, _, _) in enumerate(CATEGORIES):
        for _ in range(rng.randint(25, 45)):
            while True:
                name = f"{rng.choice(ADJECTIVES)} {rng.choice(NOUNS[c])}"
                if rng.random() < 0.4:
                    name += f" {rng.choice(COLOURS)}"
                if name not in names:
                    break
            names.add(name)
            price = max(0.99, round(level * math.exp(rng.gauss(0, spread))) - 0.01)
            products.append([name, f"SKU-{codes[len(products)]}", c, price])
    order = list(range(len(products)))
    rng.shuffle(order)
    for rank, i in enumerate(order):
        products[i].append(1.0 / (rank + 1) ** 0.8)  # Zipf popularity
    return products


def cumulative(weights):
    return list(itertools.accumulate(weights))


def pick(rng, cum):
    return bisect.bisect_right(cum, rng.random() * cum[-1])


QUANTITY_CUM = {mix: cumulative(w for _, w in ranges) for mix, ranges in QUANTITIES.items()}


def quantity(rng, mix):
    lo, hi = QUANTITIES[mix][pick(rng, QUANTITY_CUM[mix])][0]
    return rng.randint(lo, hi)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=366_000, help="number of sales (default 366000)")
    ap.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    ap.add_argument("--out", default="sales.tsv", help="output file (default sales.tsv; - for stdout)")
    args = ap.parse_args()
    if args.rows < 1:
        ap.error("--rows must be at least 1")

    rng = random.Random(args.seed)
    products = make_products(rng)
    users = 40_000
    user_cum = cumulative(1.0 / (k + 1) ** 0.6 for k in range(users))
    user_ids = rng.sample(range(100000, 1000000), users)
    # Each month's product weights: popularity × its category's season.
    monthly_cum = {
        m: cumulative(p[4] * CATEGORIES[p[2]][4].get(m, 1.0) for p in products) for m in range(1, 13)
    }
    # Hour of day profile: quiet at night, busiest around noon and in the evening.
    hour_cum = cumulative(0.2 + math.exp(-((h - 12.5) / 3) ** 2) + 1.2 * math.exp(-((h - 20) / 2.2) ** 2)
                          for h in range(24))

    out = sys.stdout if args.out == "-" else open(args.out, "w", encoding="utf-8", newline="\n")
    sale_id = 0
    for day, count in rows_per_day(args.rows):
        midnight = int(datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.timezone.utc).timestamp())
        times = sorted(pick(rng, hour_cum) * 3600 + rng.randrange(3600) for _ in range(count))
        cum = monthly_cum[day.month]
        lines = []
        for t in times:
            name, code, c, price, _ = products[pick(rng, cum)]
            q = quantity(rng, CATEGORIES[c][3])
            total = q * price
            r = rng.random()
            if r < RETURN_SHARE:
                q = -min(q, rng.randint(1, 3))
                total = q * price
            elif r < RETURN_SHARE + DISCOUNT_SHARE:
                total *= 1 - rng.choice(DISCOUNTS)
            sale_id += 1
            user = f"U{user_ids[pick(rng, user_cum)]}"
            lines.append(f"{name}\t{code}\t{day.isoformat()}\t{midnight + t}\t{q}\t{price:.2f}\t{CATEGORIES[c][0]}"
                         f"\t{user}\t{total:.2f}\t{sale_id}\n")
        out.write("".join(lines))
    if out is not sys.stdout:
        out.close()


if __name__ == "__main__":
    main()
