// opforge harness: light torch headers (see opforge_lite.h)
#pragma once
#include "../opforge_lite.h"
