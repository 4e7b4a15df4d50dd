"""Chinese public-security temporary no-fly notices (临时禁飞通告), local time UTC+8: a circle
around a point or an airport named in Chinese, a polygon of 北纬/东经 points, one or two areas,
heights as 真高 / 高度 ... 米以下; and public-security notices that order no zone (reminders,
road closures) as negatives."""

from __future__ import annotations

from datetime import datetime, timedelta

from clover.tasks.airspace.formats import Area, Msg, Turn, When, add_zone, pick_radius, polygon_area
from clover.tasks.airspace.places import CN_AIRPORTS
from clover.tasks.airspace.writing import (
    COORD_WRITERS,
    LimitSpec,
    Written,
    json_num,
    num_text,
    offset_point,
    sfc,
    unl,
)

EVENTS = ("马拉松赛", "国际车展", "重大活动", "国际博览会", "体育赛事", "大型文艺演出", "航空展览",
          "国际会议", "灯光秀")  # fmt: skip
CRAFT = "无人机、航空模型、动力伞、三角翼、热气球、孔明灯等“低慢小”航空器"
CIRCLES = ("以{c}为中心，半径{r}范围内{h}空域", "以{c}为圆心，半径{r}范围内{h}空域",
           "以{c}为中心、半径{r}的圆形区域{h}", "{c}周边{r}范围内{h}空域")  # fmt: skip
POLYGONS = ("由{p}{n}点连线围成的区域{h}", "以下列坐标点依次连线围成的范围{h}：{p}",
            "{p}连线范围内{h}空域")  # fmt: skip
POLY_JOIN = ("，", "；", "—")
HEIGHTS = ("真高{v}米以下", "真高{v}米（含）以下", "高度{v}米以下", "相对高度{v}米以下")
NUMERALS = {3: "三", 4: "四", 5: "五", 6: "六"}
NOTICES = (
    "{city}公安局关于{event}期间实施临时禁飞管控的通告\n为保障{event}安全顺利进行，根据《中华人民"
    "共和国治安管理处罚法》《无人驾驶航空器飞行管理暂行条例》等有关规定，现将有关事项通告如下：\n"
    "一、管控时间：{time}。\n二、管控区域：{area}。\n三、管控期间，上述区域内禁止放飞{craft}。\n"
    "四、对违反本通告规定的，公安机关将依法予以处罚。\n特此通告。\n{city}公安局\n{date}",
    "关于{event}期间{city}部分区域实施临时禁飞的通告\n{time}，{area}为临时禁飞区域，禁止一切{craft}"
    "飞行活动。违者依法处理。\n{city}公安局\n{date}",
    "关于划设临时禁飞区的通告\n因{event}需要，经研究决定，{time}，{area}划设为临时禁飞区。禁飞区内"
    "严禁一切“低慢小”航空器飞行活动。\n{city}公安局\n{date}",
)  # fmt: skip
NEGATIVES = (
    "{city}公安局提醒广大市民：飞行无人驾驶航空器应当遵守《无人驾驶航空器飞行管理暂行条例》，在管制"
    "空域内飞行须依法提出申请。\n{city}公安局\n{date}",
    "关于{event}期间实施交通管制的通告\n{time}，{road}实施交通管制，禁止机动车通行。\n"
    "{city}公安局交通警察支队\n{date}",
    "关于开展无人机实名登记工作的通告\n凡在本市范围内持有无人驾驶航空器的单位和个人，应当按照规定"
    "进行实名登记。\n{city}公安局\n{date}",
    "关于{event}期间加强烟花爆竹燃放管理的通告\n{time}，{road}周边禁止燃放烟花爆竹。\n{city}公安局"
    "\n{date}",
)  # fmt: skip
ROADS = ("人民路", "解放大道", "滨江路", "中山路", "世纪大道", "长江路")


def cn_time(t: Turn) -> tuple[str, When]:
    """(written text, gold When); local time is UTC+8 and an end without its date takes the
    start's."""
    rng = t.rng
    day = datetime(2024, 1, 1) + timedelta(days=rng.randrange(3 * 365))
    start = day.replace(hour=rng.randrange(6, 21), minute=rng.choice((0, 0, 0, 30)))
    days = rng.choice((0, 0, 0, 1, 2, 3, 6))
    end_day = start + timedelta(days=days)
    end_h = 24 if rng.random() < 0.3 or days == 0 and start.hour >= 20 else rng.randrange(
        start.hour + 1 if days == 0 else 6, 24)  # fmt: skip

    def stamp(d: datetime, h: int, mi: int, with_date: bool, with_year: bool) -> str:
        date = (f"{d.year}年" if with_year else "") + f"{d.month}月{d.day}日" if with_date else ""
        return f"{date}{h}时" + (f"{mi}分" if mi else "")

    s_text = stamp(start, start.hour, start.minute, True, True)
    e_text = stamp(end_day, end_h, 0, days > 0 or rng.random() < 0.3, rng.random() < 0.2)
    end_local = end_day.replace(hour=0, minute=0) + timedelta(hours=end_h)
    when = When(s_text, stamp(end_day, end_h, 0, True, True), start - timedelta(hours=8),
                end_local - timedelta(hours=8))  # fmt: skip
    return f"{s_text}至{e_text}", when


def _area(t: Turn, a: dict, msg: Msg, when: When) -> str:
    rng = t.rng
    has_upper = rng.random() < 0.75
    up = LimitSpec(rng.choice((120, 150, 300, 500, 1000)), "M", "AGL") if has_upper else unl()
    h = t.wording("cn.height", HEIGHTS).format(v=json_num(up.value)) if has_upper else ""
    point = offset_point(rng, a["lat"], a["lon"], 30)
    if rng.random() < 0.2:
        area = polygon_area(rng, point, "cn")
        joiner = t.wording("cn.poly_join", POLY_JOIN)
        text = t.wording("cn.polygon", POLYGONS).format(
            p=joiner.join(v.text for v in area.vertices), n=NUMERALS[len(area.vertices)], h=h)
    else:
        if rng.random() < 0.3:
            name = CN_AIRPORTS[a["icao"]][0]
            centre = Written(name, round(a["lat"], 7), round(a["lon"], 7))
        else:
            centre = COORD_WRITERS["cn"](*point)
        area = Area(centre, pick_radius(rng, "KM M"))
        r_text = f"{num_text(area.radius.value)}{'公里' if area.radius.unit == 'KM' else '米'}"
        text = t.wording("cn.circle", CIRCLES).format(c=centre.text, r=r_text, h=h)
    add_zone(msg, zone_id=t.zone_id(), area=area, lower=sfc(rng, 0), upper=up, when=when)
    return text


def cn_notice(t: Turn) -> Msg:
    """A Chinese public-security notice: a temporary no-fly order, or (negative) one that is not."""
    rng, a = t.rng, t.airport("cn")
    city = CN_AIRPORTS[a["icao"]][1]
    time_text, when = cn_time(t)
    event = f"{city.rstrip('市')}{rng.choice(EVENTS)}"
    issued = when.start_utc - timedelta(days=rng.randint(2, 10))
    date = f"{issued.year}年{issued.month}月{issued.day}日"
    if rng.random() < 0.15:
        text = t.wording("cn.negative", NEGATIVES).format(
            city=city, event=event, time=time_text, road=rng.choice(ROADS), date=date)
        return Msg(text=text, kind="cn_negative", templates=t.used[:])
    msg = Msg(text="", kind="cn_notice")
    n = 2 if rng.random() < 0.15 else 1
    areas = [_area(t, a, msg, when) for _ in range(n)]
    area = areas[0] if n == 1 else "；".join(f"（{'一二'[k]}）{x}" for k, x in enumerate(areas))
    msg.text = t.wording("cn.notice", NOTICES).format(
        city=city, event=event, time=time_text, area=area, craft=CRAFT, date=date)
    msg.templates = t.used[:]
    return msg
