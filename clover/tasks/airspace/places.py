"""Real places for the airspace task: airport pools per split, FIRs, US states, Chinese names.

Airports come from `airportsdata` (ICAO, name, city, country, lat/lon). The split is fixed and
deterministic: countries in `HELDOUT_COUNTRIES` and airports whose CRC32 bucket is 2 only ever
appear in the held-out split; buckets 0 and 1 are validation and test; the rest is train.
This module holds data only; it knows nothing about message formats.
"""

from __future__ import annotations

import zlib
from functools import cache

SPLITS = ("train", "validation", "test", "heldout")

# Flight information regions by country (used in the NOTAM Q-line).
FIRS: dict[str, tuple[str, ...]] = {
    "GB": ("EGTT", "EGPX"), "IE": ("EISN",), "FR": ("LFFF", "LFRR", "LFMM", "LFBB", "LFEE"),
    "DE": ("EDGG", "EDWW", "EDMM"), "NL": ("EHAA",), "BE": ("EBBU",), "CH": ("LSAS",),
    "AT": ("LOVV",), "IT": ("LIRR", "LIMM", "LIBB"), "ES": ("LECM", "LECB"), "PT": ("LPPC",),
    "DK": ("EKDK",), "NO": ("ENOR",), "SE": ("ESAA",), "FI": ("EFIN",), "PL": ("EPWW",),
    "CZ": ("LKAA",), "HU": ("LHCC",), "RO": ("LRBB",), "GR": ("LGGG",), "TR": ("LTAA", "LTBB"),
    "IL": ("LLLL",), "JO": ("OJAC",), "AE": ("OMAE",), "SA": ("OEJD",), "EG": ("HECC",),
    "IN": ("VABF", "VIDF", "VECF", "VOMF"), "CA": ("CZYZ", "CZUL", "CZVR", "CZEG", "CZWG"),
    "MA": ("GMMM",), "KE": ("HKNA",), "PH": ("RPHI",), "MY": ("WMFC",), "VN": ("VVHM", "VVHN"),
    # held-out countries: never seen in train / validation / test
    "BR": ("SBBS", "SBCW", "SBRE", "SBAZ"), "AR": ("SAEF", "SACF"), "ZA": ("FAJA", "FACA"),
    "JP": ("RJJJ",), "AU": ("YMMM", "YBBB"), "NZ": ("NZZC",), "CL": ("SCEZ",), "MX": ("MMFR",),
    "KR": ("RKRR",), "TH": ("VTBB",),
}  # fmt: skip
HELDOUT_COUNTRIES = frozenset({"BR", "AR", "ZA", "JP", "AU", "NZ", "CL", "MX", "KR", "TH"})
ENGLISH_COUNTRIES = ("GB", "IE", "CA", "IN", "US", "AU", "NZ", "ZA")

# Chinese names (airport, city) for the Chinese public-security notices.
CN_AIRPORTS: dict[str, tuple[str, str]] = {
    "ZBAA": ("北京首都国际机场", "北京市"), "ZBAD": ("北京大兴国际机场", "北京市"),
    "ZSPD": ("上海浦东国际机场", "上海市"), "ZSSS": ("上海虹桥国际机场", "上海市"),
    "ZGGG": ("广州白云国际机场", "广州市"), "ZGSZ": ("深圳宝安国际机场", "深圳市"),
    "ZUUU": ("成都双流国际机场", "成都市"), "ZUTF": ("成都天府国际机场", "成都市"),
    "ZPPP": ("昆明长水国际机场", "昆明市"), "ZLXY": ("西安咸阳国际机场", "西安市"),
    "ZHHH": ("武汉天河国际机场", "武汉市"), "ZSHC": ("杭州萧山国际机场", "杭州市"),
    "ZSNJ": ("南京禄口国际机场", "南京市"), "ZGHA": ("长沙黄花国际机场", "长沙市"),
    "ZUCK": ("重庆江北国际机场", "重庆市"), "ZSQD": ("青岛胶东国际机场", "青岛市"),
    "ZSAM": ("厦门高崎国际机场", "厦门市"), "ZGNN": ("南宁吴圩国际机场", "南宁市"),
    "ZYTX": ("沈阳桃仙国际机场", "沈阳市"), "ZYHB": ("哈尔滨太平国际机场", "哈尔滨市"),
    "ZWWW": ("乌鲁木齐地窝堡国际机场", "乌鲁木齐市"), "ZSJN": ("济南遥墙国际机场", "济南市"),
    "ZHCC": ("郑州新郑国际机场", "郑州市"), "ZJHK": ("海口美兰国际机场", "海口市"),
    "ZJSY": ("三亚凤凰国际机场", "三亚市"), "ZBTJ": ("天津滨海国际机场", "天津市"),
    "ZSFZ": ("福州长乐国际机场", "福州市"), "ZLLL": ("兰州中川国际机场", "兰州市"),
    "ZUGY": ("贵阳龙洞堡国际机场", "贵阳市"), "ZSOF": ("合肥新桥国际机场", "合肥市"),
}  # fmt: skip
CN_HELDOUT = frozenset({"ZJSY", "ZJHK", "ZWWW", "ZYHB", "ZLLL", "ZUGY"})
CN_VALIDATION = frozenset({"ZSNJ", "ZGHA", "ZSAM"})
CN_TEST = frozenset({"ZHCC", "ZSOF", "ZBTJ"})

US_STATES: dict[str, tuple[str, str]] = {  # name -> (abbreviation, ARTCC)
    "Alabama": ("AL", "ZTL"), "Alaska": ("AK", "ZAN"), "Arizona": ("AZ", "ZAB"),
    "Arkansas": ("AR", "ZME"), "California": ("CA", "ZLA"), "Colorado": ("CO", "ZDV"),
    "Connecticut": ("CT", "ZBW"), "Delaware": ("DE", "ZDC"), "District of Columbia": ("DC", "ZDC"),
    "Florida": ("FL", "ZJX"), "Georgia": ("GA", "ZTL"), "Hawaii": ("HI", "ZHN"),
    "Idaho": ("ID", "ZLC"), "Illinois": ("IL", "ZAU"), "Indiana": ("IN", "ZID"),
    "Iowa": ("IA", "ZMP"), "Kansas": ("KS", "ZKC"), "Kentucky": ("KY", "ZID"),
    "Louisiana": ("LA", "ZHU"), "Maine": ("ME", "ZBW"), "Maryland": ("MD", "ZDC"),
    "Massachusetts": ("MA", "ZBW"), "Michigan": ("MI", "ZOB"), "Minnesota": ("MN", "ZMP"),
    "Mississippi": ("MS", "ZME"), "Missouri": ("MO", "ZKC"), "Montana": ("MT", "ZLC"),
    "Nebraska": ("NE", "ZMP"), "Nevada": ("NV", "ZOA"), "New Hampshire": ("NH", "ZBW"),
    "New Jersey": ("NJ", "ZNY"), "New Mexico": ("NM", "ZAB"), "New York": ("NY", "ZNY"),
    "North Carolina": ("NC", "ZDC"), "North Dakota": ("ND", "ZMP"), "Ohio": ("OH", "ZOB"),
    "Oklahoma": ("OK", "ZFW"), "Oregon": ("OR", "ZSE"), "Pennsylvania": ("PA", "ZNY"),
    "Rhode Island": ("RI", "ZBW"), "South Carolina": ("SC", "ZJX"), "South Dakota": ("SD", "ZMP"),
    "Tennessee": ("TN", "ZME"), "Texas": ("TX", "ZFW"), "Utah": ("UT", "ZLC"),
    "Vermont": ("VT", "ZBW"), "Virginia": ("VA", "ZDC"), "Washington": ("WA", "ZSE"),
    "West Virginia": ("WV", "ZDC"), "Wisconsin": ("WI", "ZAU"), "Wyoming": ("WY", "ZDV"),
}  # fmt: skip


@cache
def load_airports() -> dict[str, dict]:
    """airportsdata's airports by ICAO code; ImportError naming the extra when it is missing."""
    try:
        import airportsdata
    except ImportError:
        raise ImportError("the airspace task needs the airportsdata package: install the task "
                          "extra, pip install -e '.[task]' (make setup does)") from None
    return airportsdata.load("ICAO")


def split_of(icao: str, country: str) -> str:
    """The one split an airport belongs to (stable across runs and machines)."""
    if country in HELDOUT_COUNTRIES or (country == "CN" and icao in CN_HELDOUT):
        return "heldout"
    if country == "CN" and icao in CN_AIRPORTS:  # few names: split them by hand, 3 + 3
        return "validation" if icao in CN_VALIDATION else "test" if icao in CN_TEST else "train"
    bucket = zlib.crc32(icao.encode()) % 20
    return ("validation", "test", "heldout")[bucket] if bucket < 3 else "train"


def _eligible(a: dict) -> bool:
    code = a["icao"]
    return bool(a["iata"]) and len(code) == 4 and code.isalpha() and bool(a["city"])


@cache
def airport_pools(split: str) -> dict[str, tuple[dict, ...]]:
    """Airports of `split` grouped by the message family that uses them: icao, faa, cn, plain."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use one of {', '.join(SPLITS)}")
    pools: dict[str, list[dict]] = {"icao": [], "faa": [], "cn": [], "plain": []}
    for a in load_airports().values():
        c = a["country"]
        in_cn_table = c == "CN" and a["icao"] in CN_AIRPORTS
        if not (_eligible(a) or in_cn_table) or split_of(a["icao"], c) != split:
            continue
        if c in FIRS:
            pools["icao"].append(a)
        if c == "US" and a["subd"] in US_STATES:
            pools["faa"].append(a)
        if in_cn_table:
            pools["cn"].append(a)
        if c in ENGLISH_COUNTRIES:
            pools["plain"].append(a)
    return {k: tuple(sorted(v, key=lambda a: a["icao"])) for k, v in pools.items()}
